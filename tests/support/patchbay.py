"""The rig of the daemon's audio tests: a JACK client that records the daemon's output and plays
speech into its input (`Patchbay`), the event socket collected on a thread (`Subscriber`), and
speech from espeak-ng (`espeak`); `audio_rig` puts them around one daemon."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import zmq
from support.daemon import Daemon

from edged.client import Client


def need_jack_and_espeak() -> None:
    """Skips the calling test module where the audio server or the speaking voice is missing."""
    if shutil.which("jackd") is None or shutil.which("espeak-ng") is None:
        import pytest  # here: the benchmarks under scripts/ use this module without pytest

        pytest.skip("jackd and espeak-ng are needed (scripts/install-system-deps.sh installs them)",
                    allow_module_level=True)

RATE = 24000
TEXT = "Hello there, this is a test of the speaker, and it goes on for a while."


class Patchbay:
    """A JACK client: `rec` records (with each cycle's JACK frame time), `voice` plays a buffer."""

    def __init__(self, server: str, seconds: float = 300.0) -> None:
        import jack

        self.client = jack.Client("edged-patchbay", no_start_server=True, servername=server)
        self.rec_port = self.client.inports.register("rec")
        self.voice_port = self.client.outports.register("voice")
        self.rec = np.zeros(int(seconds * RATE), dtype=np.float32)
        self.pos = 0
        self.voice: np.ndarray | None = None
        self.voice_pos = 0
        self.voice_start = -1
        """Recording index at which the voice's first sample went out."""
        self.xruns = 0
        """Audio-server xruns seen (a cycle that missed its deadline: the recording may shift)."""
        self.cycle_frames = np.full(len(self.rec) // 64 + 1, -1, dtype=np.int64)
        """JACK frame time of each cycle's first recorded sample, by cycle (see `frame_of`)."""
        self.period = 0
        self.client.set_process_callback(self._process)
        self.client.set_xrun_callback(self._xrun)
        self.client.activate()

    def _xrun(self, delayed_usecs: float) -> None:
        self.xruns += 1

    def _process(self, frames: int) -> None:
        self.period = frames
        if self.pos + frames <= len(self.rec):
            self.cycle_frames[self.pos // frames] = self.client.last_frame_time
            self.rec[self.pos:self.pos + frames] = self.rec_port.get_array()
        out = self.voice_port.get_array()
        out[:] = 0.0
        if self.voice is not None and self.voice_pos < len(self.voice):
            if self.voice_pos == 0:
                self.voice_start = self.pos
            n = min(frames, len(self.voice) - self.voice_pos)
            out[:n] = self.voice[self.voice_pos:self.voice_pos + n]
            self.voice_pos += n
        self.pos += frames

    def say(self, pcm: np.ndarray) -> None:
        self.voice_pos, self.voice_start = 0, -1
        self.voice = pcm

    def mark(self) -> int:
        return self.pos

    def wait_said(self, timeout: float = 30.0) -> None:
        """Waits on the audio clock until the voice, if one was said, has gone out to its last sample."""
        deadline = time.monotonic() + timeout
        while self.voice is not None and self.voice_pos < len(self.voice):
            assert time.monotonic() < deadline, "the voice never finished playing"
            time.sleep(0.01)

    def frame_of(self, index: int) -> int:
        """The JACK frame time of rec[index] (cycles an xrun skipped are not in the recording)."""
        return int(self.cycle_frames[index // self.period]) + index % self.period

    def daemon_ports(self) -> tuple[str, str]:
        outs = [p.name for p in self.client.get_ports("PortAudio", is_audio=True, is_output=True)]
        ins = [p.name for p in self.client.get_ports("PortAudio", is_audio=True, is_input=True)]
        assert len(outs) == 1 and len(ins) == 1, (outs, ins)
        return outs[0], ins[0]

    def patch(self, *, record: bool = True, voice: bool = False, loopback: bool = False) -> None:
        """Connect the daemon's output to `rec`; its input to `voice` and/or its own output only."""
        out, inp = self.daemon_ports()
        for port in (self.rec_port.name, inp):
            for other in self.client.get_all_connections(port):
                self.client.disconnect(other, port)
        if record:
            self.client.connect(out, self.rec_port.name)
        if voice:
            self.client.connect(self.voice_port.name, inp)
        if loopback:
            self.client.connect(out, inp)

    def close(self) -> None:
        self.client.deactivate()
        self.client.close()


class Subscriber:
    """The daemon's event socket, collected on a thread."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.setsockopt(zmq.RCVTIMEO, 100)
        self.socket.connect(endpoint)
        self.events: list[tuple[dict, bytes | None]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                frames = self.socket.recv_multipart()
            except zmq.Again:
                continue
            self.events.append((msgpack.unpackb(frames[1]), frames[2] if len(frames) > 2 else None))

    def of(self, name: str) -> list[dict]:
        return [h for h, _ in list(self.events) if h["event"] == name]

    def mic_audio(self) -> np.ndarray:
        chunks = [np.frombuffer(pcm, "<i2") for h, pcm in list(self.events) if h["event"] == "mic" and pcm]
        return np.concatenate(chunks).astype(np.float32) / 32767 if chunks else np.zeros(0, np.float32)

    def clear(self) -> None:
        self.events.clear()

    def wait_mic(self, until: int, timeout: float = 10.0) -> None:
        """Waits until the `mic` events collected reach 16 kHz sample `until` of the daemon's stream."""
        deadline = time.monotonic() + timeout
        while not any(h["first_sample"] + h["samples"] >= until for h in self.of("mic")):
            assert time.monotonic() < deadline, f"no mic audio up to sample {until} within {timeout} s"
            time.sleep(0.01)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.socket.close(linger=0)


def first_sound(rec: np.ndarray, since: int, until: int) -> int | None:
    nz = np.flatnonzero(rec[since:until])
    return since + int(nz[0]) if len(nz) else None


def reply_start(rec: np.ndarray, since: int) -> int:
    start = first_sound(rec, since, len(rec))
    assert start is not None, "the daemon's output was never recorded"
    return start


def wait_recorded(bay, since: int, samples: int, timeout: float = 10.0) -> int:
    """Waits on the audio clock until `samples` of a reply started after `since` are recorded;
    returns where it starts. The recording is written only behind `bay.pos`."""
    deadline = time.monotonic() + timeout
    while True:
        pos = bay.pos
        start = first_sound(bay.rec, since, pos)
        if start is not None and pos - start >= samples:
            return start
        assert time.monotonic() < deadline, f"{samples} samples of the reply not recorded within {timeout} s"
        time.sleep(0.005)


def wait_pos(bay, index: int, timeout: float = 10.0) -> None:
    """Waits on the audio clock until the recording holds rec[:index]."""
    deadline = time.monotonic() + timeout
    while bay.pos < index:
        assert time.monotonic() < deadline, f"recording at {bay.pos}, not at {index} within {timeout} s"
        time.sleep(0.005)


def heard(bay, start: int, pcm: np.ndarray) -> int:
    """Samples of `pcm` recorded from `start` on, bit-exactly, followed only by silence: a second of
    it past where `pcm` would end, waited for on the audio clock (never unrecorded zeros)."""
    wait_pos(bay, start + len(pcm) + RATE)
    rec = bay.rec
    seg = rec[start:start + len(pcm)]
    n = len(seg) if np.array_equal(seg, pcm[:len(seg)]) else int(np.flatnonzero(seg != pcm[:len(seg)])[0])
    assert not np.any(rec[start + n:start + len(pcm) + RATE]), "sound after the reply's recorded prefix"
    return n


def onset_in_mic(mic: np.ndarray, since: int, speech: np.ndarray, level: float = 0.02) -> int:
    """The index in `mic` (the daemon's published 16 kHz microphone audio) where `speech` (at RATE)
    begins, found at or after `since`: where the speech best lines up (cross-correlation), plus its
    own onset (the first sample above `level`). A residual click before the user cannot pass for the
    onset, as a threshold on the microphone alone would let it, nor can a first word the echo
    canceller suppressed. `mic` must hold the whole speech after `since` (`mic_after`)."""
    import soxr
    from scipy.signal import correlate

    speech16 = soxr.resample(speech, RATE, 16000).astype(np.float32)
    tail = mic[since:]
    assert len(tail) >= len(speech16), f"{len(tail)} mic samples after the search's start, the speech is {len(speech16)}"
    lag = int(np.argmax(correlate(tail, speech16, mode="valid", method="fft")))
    return since + lag + int(np.flatnonzero(np.abs(speech16) > level)[0])


def mic_after(sub: Subscriber, since: int, speech: np.ndarray) -> np.ndarray:
    """The published mic audio from its first collected event, once it holds `speech` (at RATE)
    whole after 16 kHz sample `since` of the daemon's stream, and a tenth of a second more."""
    sub.wait_mic(since + -(-len(speech) * 16000 // RATE) + 1600)
    return sub.mic_audio()


def quiet(client, voice) -> None:
    """Waits until the rig's user has finished speaking (`voice.wait_said()`: a barge-in ends the
    reply, not the user's sentence) and the listener hears no speech. The listener alone is not
    enough: it stops hearing speech in the sentence's first pause, and a reply started then would
    be cut by the rest of the sentence."""
    voice.wait_said()
    deadline = time.monotonic() + 5
    while client.status()["audio"]["input"]["speaking"]:
        assert time.monotonic() < deadline, "the listener still hears speech"
        time.sleep(0.1)


def espeak(text: str, tmp, voice: str = "en-us") -> np.ndarray:
    """Speech rendered by espeak-ng, at RATE."""
    import soxr

    path = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True)
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32767
        rate = w.getframerate()
    return soxr.resample(pcm, rate, RATE).astype(np.float32)


@contextmanager
def audio_rig(server: str, tmp: Path, config: str, voice: Path | None = None) -> Iterator[tuple]:
    """(daemon, patchbay, event subscriber, client, espeak speech) for one daemon on JACK server
    `server`, its devices the server's "system" ports (a sound card of the test machine is never
    used) and its events on their own ipc socket; `config` adds to that, `voice` is the daemon's
    speech stand-in (support/voiced.py). Everything is closed after, and the daemon must exit 0."""
    events = f"ipc://{tmp / 'events.sock'}"
    daemon = Daemon(tmp, config=f'[events]\nlisten = "{events}"\n[audio]\ndevice = "system"\n'
                                f'input_device = "system"\n{config}', voice=voice)
    bay = Patchbay(server)
    sub = Subscriber(events)
    client = Client(daemon.endpoint)
    try:
        speech = espeak("Stop! Please stop talking now.", tmp)
        yield daemon, bay, sub, client, speech
    except BaseException:
        daemon.close()  # a failure while the rig was set up: the daemon must not outlive the test
        raise
    finally:
        client.close()
        sub.close()
        bay.close()
    assert daemon.terminate() == 0
    daemon.close()
