"""The room on a JACK server: a client between the daemon's output port and its input port.

Its `speaker` input takes what the daemon's speaker plays; its `mic` output is what a microphone 6.7 cm
from that loudspeaker would hear (`support.room.RoomMic`: a mildly clipping loudspeaker, the room's
impulse response by partitioned FFT convolution, a user's voice through its own path, microphone
noise), delayed by the device's DAC and ADC latency as the daemon's PortAudio streams report them
(`latency`), so the daemon meets the echo where a real device would put it. `echo_gain` sets the
echo's level (1: the daemon's voice level at the microphone; louder is the volume turned up). `say`
starts a user speaking, at a level below the echo's (at unit echo gain); `move` changes the echo path
(someone moved); `enter` puts the device in another room. Positions are JACK frame times
(`client.last_frame_time`), the clock the patchbay records on too.

Two ways a device may differ from what the daemon is told, each off unless asked for:
- `echo_latency`: the echo's delay before the room when the reported latency is wrong (a USB or HDMI
  path's buffering that PortAudio does not see); `latency` stays what the daemon reports.
- `drift_ppm`: the microphone's clock samples that many parts per million faster (slower, below zero)
  than the speaker's plays: the loudspeaker's output goes through `support.drift.Drift` (a streaming
  resampler and FIFO giving exactly a cycle's samples) before the room. Its FIFO's silence is part of
  `echo_latency` (which must be at least DRIFT_DELAY then, and for a slower microphone also the
  samples the drift takes from the FIFO over the rig's `seconds`: 720 at -100 ppm over 300 s), and
  the echo's delay grows (or shrinks) by the drift from there on: `echo_delay()`.
"""

from __future__ import annotations

import math
import time

import numpy as np
from support.drift import Drift
from support.room import Room, RoomMic, active_rms, convolve

RATE = 24000
DRIFT_DELAY = 1024
"""The drift's FIFO starts with at least this much silence: soxr gives about 800 samples every third
cycle, and a cycle's pull follows its push (support/drift.py's default allows for two pulls in a row).
Measured over 120 s of noise from a FIFO of 2000: the least it held before a pull was 1077 samples at
+100 ppm; at -100 ppm 1055 over the first 10 s and 793 over 120 s, the drift's 2.4 samples a second."""


class RoomRig:
    def __init__(self, server: str, room: Room, *, latency: int, period: int = 256, seed: int = 0,
                 seconds: float = 300.0, echo_latency: int | None = None, drift_ppm: float = 0.0,
                 echo_gain: float = 1.0) -> None:
        import jack

        self.client = jack.Client("edged-room", no_start_server=True, servername=server)
        self.speaker_port = self.client.inports.register("speaker")
        self.mic_port = self.client.outports.register("mic")
        self.period = period
        self.echo_latency = latency if echo_latency is None else echo_latency
        self.drift: Drift | None = None
        line = self.echo_latency
        if drift_ppm:
            fifo = DRIFT_DELAY + max(0, math.ceil(-drift_ppm * 1e-6 * seconds * RATE))  # a slower microphone drains it
            assert line >= fifo, f"an echo latency of {line} samples is shorter than the drift's FIFO ({fifo})"
            self.drift, line = Drift(drift_ppm, delay=fifo), line - fifo
            self.drifted = np.zeros(period, dtype=np.float32)
        self.line = np.zeros(line + period, dtype=np.float32)
        """The device's latency: the loudspeaker plays what the daemon wrote `echo_latency` samples ago
        (the drift's FIFO taking its share)."""
        self.seed, self.echo_gain = seed, echo_gain
        self.room = RoomMic(room, period, seed=seed, echo_gain=echo_gain)
        self.voice_frame = -1
        """JACK frame time of the cycle in which the user's voice began (its first sample)."""
        self.latency = latency
        self.rec = np.zeros(int(seconds * RATE), dtype=np.float32)
        """What the microphone gave the daemon, cycle by cycle (see `index_of`)."""
        self.cycle_frames = np.full(len(self.rec) // period + 1, -1, dtype=np.int64)
        self.pos = 0
        self.client.set_process_callback(self._process)
        self.client.activate()

    def _process(self, frames: int) -> None:
        line = self.line
        line[:-frames] = line[frames:]
        line[-frames:] = self.speaker_port.get_array()
        room = self.room
        starting = room.voice is not None and room.voice_pos == 0
        mic = self.mic_port.get_array()
        played = line[:frames]
        if self.drift is not None:
            self.drift.push(played)
            self.drift.pull(self.drifted[:frames])
            played = self.drifted[:frames]
        mic[:] = room(played)
        now = self.client.last_frame_time
        if starting:
            self.voice_frame = now
        if self.pos + frames <= len(self.rec):
            self.rec[self.pos:self.pos + frames] = mic
            self.cycle_frames[self.pos // self.period] = now
        self.pos += frames

    def echo_delay(self) -> float:
        """Samples from the daemon's output to the loudspeaker's sound in the microphone now (before
        the room's own delay): `echo_latency`, and the drift so far."""
        if self.drift is None:
            return float(self.echo_latency)
        return len(self.line) - self.period + self.drift.echo_delay()

    def index_of(self, frame: int) -> int:
        """Where JACK frame time `frame` lies in `rec` (in a cycle it recorded)."""
        cycle = int(np.searchsorted(self.cycle_frames[:self.pos // self.period], frame, side="right")) - 1
        return cycle * self.period + frame - int(self.cycle_frames[cycle])

    def connect(self, daemon_out: str, daemon_in: str) -> None:
        self.client.connect(daemon_out, self.speaker_port.name)
        self.client.connect(self.mic_port.name, daemon_in)

    def say(self, pcm: np.ndarray, below_echo_db: float, echo_rms: float) -> int:
        """The user speaks `pcm`, at the microphone `below_echo_db` under an echo of active level
        `echo_rms` (of the daemon's output: the echo path has unit energy). Returns the offset of the
        user's onset at the microphone from the voice's first sample (the user path's delay)."""
        path = self.room.paths.user
        at_mic = convolve(np.concatenate([pcm, np.zeros(len(path), np.float32)]), path)
        gain = echo_rms * 10 ** (-below_echo_db / 20) / active_rms(at_mic)
        self.room.user.set(path * gain, crossfade=False)
        self.room.say(pcm)
        return int(np.flatnonzero(np.abs(at_mic) > 0.01 * np.abs(at_mic).max())[0])

    def wait_said(self, timeout: float = 30.0) -> None:
        """Waits until the user's voice has been played into the room to its last sample and its
        reverberation (the user path's length) has reached the microphone, counted in audio cycles;
        at once when nobody has spoken."""
        room = self.room
        if room.voice is None:
            return
        tail_cycles = -(-len(room.paths.user) // self.period)
        deadline = time.monotonic() + timeout
        while room.voice_pos < len(room.voice):
            assert time.monotonic() < deadline, "the user's voice never finished playing"
            time.sleep(0.01)
        done_at = self.pos + tail_cycles * self.period
        while self.pos < done_at:
            assert time.monotonic() < deadline, "the audio server stopped"
            time.sleep(0.01)

    def move(self) -> None:
        """Someone moved: the echo path changes from the next cycle."""
        self.room.move()

    def enter(self, room: Room) -> None:
        """The device is taken into another room (between replies: the echo's history is dropped)."""
        self.room = RoomMic(room, self.period, seed=self.seed, echo_gain=self.echo_gain)

    def close(self) -> None:
        self.client.deactivate()
        self.client.close()
