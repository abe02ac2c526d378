"""A real audio server for the audio tests: JACK's dummy backend, real-time paced, no hardware.

Order matters and is kept here:
1. start `jackd` with a server name unique to this test session, and point JACK_DEFAULT_SERVER at it;
2. only then load sounddevice (PortAudio enumerates JACK devices when it initializes; if something
   loaded it earlier, it is re-initialized);
3. a JACK client (`Recorder`) records the playback's output port, bit-exactly, with the JACK frame
   time of every cycle, so positions in the recording are positions on the JACK clock;
4. teardown: playbacks close their streams (per test), the recorder closes, PortAudio terminates,
   and last jackd stops.

The module is skipped only when jackd is not installed (CI installs jackd2).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import jackd

from edged.collector import freeze_boot

jackd.clear_stale_state()  # now: this process has not been a JACK client yet

RATE = 24000
"""JACK's rate: the artifact's, so nothing is resampled and output can be compared bit-exactly."""
PERIOD = 256
"""JACK frames per cycle (10.7 ms): the audio period the bounds below are stated in."""


@dataclass(frozen=True)
class JackServer:
    name: str
    rate: int
    period: int
    log: Path
    """jackd's output."""


SWITCH_S = 0.0005
"""The interpreter's thread switch interval in this process while the audio tests run (Python's default
is 5 ms): the rigs' JACK callbacks (support/patchbay.py, support/room_rig.py) run Python in this
process, in parallel where the graph allows, and a callback waiting on another thread for the GIL
would wait up to the interval, half of a 10.7 ms cycle; jackd named the patchbay the late client
of most xruns on a 2-core AMD Zen 3."""


@pytest.fixture(scope="session", autouse=True)
def a_rig_that_keeps_its_deadlines():
    """The test process as an audio process keeps itself: what it made before the audio tests frozen out
    of the garbage collector's full collections (which would hold the GIL, and so the rigs' callbacks,
    for tens of ms over a test session's heap: edged/collector.py does the same for the daemon), and
    the GIL handed over at SWITCH_S."""
    freeze_boot()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    yield
    sys.setswitchinterval(switch)
    gc.unfreeze()


@pytest.fixture(scope="module")
def jack_server(tmp_path_factory):
    """A jackd dummy server (RATE, PERIOD) named for this session, real-time where it may be (jackd -R:
    as a device's audio server, it and its clients' threads outrank the daemon's audio threads). Its
    output goes to a file, never to a pipe nobody reads (a full pipe would stall the server's
    writes); each xrun's line there names the client that was late."""
    if shutil.which("jackd") is None:
        pytest.skip("jackd is not installed (scripts/install-system-deps.sh installs jackd2)")
    name = f"edged-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "JACK_NO_AUDIO_RESERVATION": "1"}
    log = tmp_path_factory.mktemp("jackd") / "jackd.log"
    with open(log, "w") as out:
        proc = jackd.start(name, RATE, PERIOD, env=env, stdout=out, stderr=subprocess.STDOUT)
    os.environ["JACK_DEFAULT_SERVER"] = name
    os.environ["JACK_NO_AUDIO_RESERVATION"] = "1"
    os.environ["JACK_NO_START_SERVER"] = "1"
    import jack

    jack.set_error_function(lambda message: None)  # "cannot connect" while jackd starts is expected
    client = None
    deadline = time.monotonic() + 10
    while client is None:
        if proc.poll() is not None:
            pytest.fail(f"jackd exited with {proc.returncode}: {log.read_text()[-4000:]}")
        try:
            client = jack.Client("edged-probe", no_start_server=True, servername=name)
        except jack.JackError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("jackd did not accept clients within 10 s")
            time.sleep(0.05)
    assert client.samplerate == RATE and client.blocksize == PERIOD
    client.close()
    jack.set_error_function(None)
    yield JackServer(name, RATE, PERIOD, log)
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    os.environ.pop("JACK_DEFAULT_SERVER", None)


@pytest.fixture(scope="module")
def sd(jack_server):
    """sounddevice, loaded (or re-initialized) after jackd is up; PortAudio terminated before jackd stops."""
    already = "sounddevice" in sys.modules
    import sounddevice

    if already:  # PortAudio enumerated devices before jackd ran (or an earlier module terminated it): again
        if sounddevice._initialized:
            sounddevice._terminate()
        sounddevice._initialize()
    yield sounddevice
    sounddevice._terminate()


@pytest.fixture(scope="module")
def jack_device(sd) -> int:
    """The index of the JACK output device PortAudio sees."""
    for api in sd.query_hostapis():
        if "JACK" in api["name"] and api["default_output_device"] >= 0:
            return int(api["default_output_device"])
    pytest.fail(f"PortAudio sees no JACK output device: {sd.query_hostapis()}")


class Recorder:
    """A JACK client with one input port, recording into a buffer allocated once.

    For cycle k it keeps the JACK frame time of the cycle's start (`cycle_frame[k]`) and where the
    cycle's samples begin in the recording (`cycle_pos[k]`), so a recording index maps to JACK frames.
    """

    def __init__(self, server: str, seconds: float = 30.0) -> None:
        import jack

        self.client = jack.Client("edged-recorder", no_start_server=True, servername=server)
        self.port = self.client.inports.register("in")
        self.rec = np.zeros(int(seconds * RATE), dtype=np.float32)
        self.cycle_frame = np.zeros(len(self.rec) // 16, dtype=np.int64)
        self.cycle_pos = np.zeros(len(self.rec) // 16, dtype=np.int64)
        self.pos = 0
        self.cycles = 0
        self.armed = False
        self.xruns = 0
        self.client.set_process_callback(self._process)
        self.client.set_xrun_callback(self._xrun)
        self.client.activate()

    def _xrun(self, delayed_usecs: float) -> None:
        self.xruns += 1

    def _process(self, frames: int) -> None:
        if not self.armed or self.pos + frames > len(self.rec):
            return
        self.rec[self.pos:self.pos + frames] = self.port.get_array()
        self.cycle_frame[self.cycles] = self.client.last_frame_time
        self.cycle_pos[self.cycles] = self.pos
        self.cycles += 1
        self.pos += frames

    def start(self) -> None:
        """Forget what was recorded and record from the next cycle on."""
        self.armed = False
        time.sleep(2 * PERIOD / RATE)
        self.pos = 0
        self.cycles = 0
        self.rec[:] = 0.0
        self.armed = True

    def stop(self) -> np.ndarray:
        """Stop after two more cycles have been recorded (counted on the audio clock, not slept: what
        a player has handed to the graph reaches this port within a period, however loaded the
        machine is)."""
        until, deadline = self.cycles + 2, time.monotonic() + 5.0
        while self.armed and self.cycles < until and time.monotonic() < deadline:
            time.sleep(PERIOD / RATE / 4)
        self.armed = False
        time.sleep(2 * PERIOD / RATE)
        return self.rec[:self.pos]

    def frame_of(self, index: int) -> int:
        """The JACK frame time at which recording index `index` passed through the graph."""
        k = int(np.searchsorted(self.cycle_pos[:self.cycles], index, side="right")) - 1
        return int(self.cycle_frame[k] + (index - self.cycle_pos[k]))

    def received(self, first_index: int) -> int:
        """Samples recorded so far from `first_index` on."""
        return max(0, self.pos - first_index)

    def connect_from(self, port_name: str) -> None:
        for existing in self.port.connections:
            self.client.disconnect(existing, self.port)
        self.client.connect(port_name, self.port)

    def portaudio_output(self) -> str:
        """The name of PortAudio's (the playback's) output port."""
        ports = [p.name for p in self.client.get_ports(is_audio=True, is_output=True)
                 if not p.name.startswith(("system:", "edged-recorder:"))]
        assert len(ports) == 1, ports
        return ports[0]

    def close(self) -> None:
        self.armed = False
        self.client.deactivate()
        self.client.close()


@pytest.fixture(scope="module")
def recorder(jack_server, sd):
    rec = Recorder(jack_server.name)
    yield rec
    rec.close()
