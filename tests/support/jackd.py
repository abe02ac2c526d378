"""Starting JACK dummy servers for tests, on a machine where earlier servers may have died.

JACK keeps a registry of servers in shared memory (/dev/shm/jack-shm-registry) with room for a few
of them; a server that was killed, or whose clients died with it, can leave its entry behind, and
entries of other names are never reclaimed: after enough of them a new server fails with "Too many
servers already active". When no JACK server runs at all, nothing in /dev/shm/jack* is in use, so
the tests clear it once, before this process has been a JACK client (a process that has attached
to the registry must keep it: libjack in that process would not see a new one). A user's running
JACK server is never touched.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def clear_stale_state() -> None:
    """Call before this process opens any JACK client (or PortAudio's JACK host API)."""
    if subprocess.run(["pgrep", "-x", "jackd"], capture_output=True).returncode == 0:
        return  # a JACK server is running: its state is live
    for path in Path("/dev/shm").glob("jack*"):
        if path.is_dir():  # jack_db-<uid>: the server's metadata database
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


REALTIME_PRIORITY = 70
"""jackd -P with real time on: its own thread's priority; its clients' process threads run just below
(above the daemon's audio.realtime_priority, as an audio server's are)."""


def start(name: str, rate: int = 24000, period: int = 256, realtime: bool = True, **popen) -> subprocess.Popen:
    """jackd -n NAME with the dummy backend (real-time paced, no hardware; a generous client timeout
    so a busy machine does not kick clients), real-time as an audio server is (-R: the server and
    every client's process thread SCHED_FIFO, above the daemon's audio threads, which would otherwise
    preempt it; where real time is refused jackd says so and runs without). `realtime=False`:
    --no-realtime."""
    priority = ["-R", "-P", str(REALTIME_PRIORITY)] if realtime else ["--no-realtime"]
    return subprocess.Popen(["jackd", "-n", name, *priority, "-t", "5000", "-d", "dummy", "-r", str(rate),
                             "-p", str(period)], **popen)
