"""The real daemon as a subprocess: `python -m edged serve`, ready when it sends READY=1.

Each daemon gets its own NOTIFY_SOCKET (`NotifySocket`), a datagram socket bound by the test, so tests
see the same readiness, status, watchdog and stopping messages systemd would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

GREEDY = "\n[sampling]\ntemperature = 0.0\ncp_temperature = 0.0\nrepetition_penalty = 1.0\n"


class NotifySocket:
    """systemd's end of sd_notify: a datagram socket at `address`, a path or "@name" (an abstract
    socket, which every user of this network namespace can reach), and the lines received on it."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.messages: list[str] = []

    def receive(self, duration: float) -> list[str]:
        """Every notify line that arrives during the next `duration` seconds."""
        deadline = time.monotonic() + duration
        got = []
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                got += self.sock.recv(4096).decode().splitlines()
            except TimeoutError:
                break
        self.messages += got
        return got

    def wait_for(self, line: str, timeout: float, proc: subprocess.Popen, log: Callable[[], str]) -> None:
        """Until `line` arrives; an error with the process's log when it exits first or the time is up."""
        deadline = time.monotonic() + timeout
        while line not in self.messages:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {line} within {timeout} s; got {self.messages}\n{log()}")
            self.receive(0.1)

    def close(self) -> None:
        self.sock.close()


class Daemon:
    def __init__(self, tmp: Path, *, config: str = "", endpoint: str | None = None, watchdog_usec: int | None = None,
                 state: Path | None = None, wrap: tuple[str, ...] = (), voice: Path | None = None,
                 args: tuple[str, ...] = (), ready_s: float = 60, command: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        """state: the daemon's state directory parent (XDG_STATE_HOME); default tmp/state. Give a
        restarted daemon the first one's to keep its history. wrap: a command line the daemon's runs
        inside (it must exec it, so the process is the daemon's), e.g. a private mount namespace.
        voice: a .npy of speech that stands in for every reply's PCM at the speaker (support/voiced.py).
        args: more `edged serve` options (e.g. --audio-device NAME). ready_s: how long its boot may take
        (an emulated CPU's is minutes). command: what runs `edged` instead of `python -m edged`
        (e.g. tests/support/with_fake_trt.py VERSION); env: more environment variables."""
        self.tmp = tmp
        self.endpoint = endpoint or f"ipc://{tmp / 'edged.sock'}"
        self.notify = NotifySocket(str(tmp / "notify.sock"))
        self.messages = self.notify.messages
        # Greedy by default: the tests count frames, and greedy is deterministic (their texts were
        # checked not to reach eos on the built-in model within the frames they ask for).
        # No sound card of the test machine, and no shared event socket, unless the test asks.
        quiet = ("" if "[audio]" in config else '\n[audio]\ndevice = "none"\ninput_device = "none"\n') + \
                ("" if "[events]" in config else '\n[events]\nlisten = "none"\n')
        (tmp / "edged.toml").write_text(config + quiet + GREEDY)
        more = env or {}
        env = {**os.environ, "NOTIFY_SOCKET": self.notify.address, "PYTHONUNBUFFERED": "1",
               "XDG_STATE_HOME": str(state or tmp / "state"), **more}  # the history database: in the test's directory
        env.pop("JOURNAL_STREAM", None)
        env.pop("INVOCATION_ID", None)
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.log = open(tmp / "daemon.log", "w")
        self.state = state or tmp / "state"
        edged = list(command) or ([sys.executable, "-m", "edged"] if voice is None else
                                  [sys.executable, str(Path(__file__).with_name("voiced.py")), str(voice)])
        self.proc = subprocess.Popen(
            [*wrap, *edged, "serve", "--config", str(tmp / "edged.toml"), "--listen", self.endpoint, *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_for("READY=1", timeout=ready_s)

    def receive(self, duration: float) -> list[str]:
        """Every notify line that arrives during the next `duration` seconds."""
        return self.notify.receive(duration)

    def wait_for(self, line: str, timeout: float) -> None:
        self.notify.wait_for(line, timeout, self.proc, self.read_log)

    def read_log(self) -> str:
        self.log.flush()
        return (self.tmp / "daemon.log").read_text()

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()
        self.log.close()
