"""A room for the echo and barge-in tests: what a microphone a few centimetres from the loudspeaker
hears of the daemon's own voice and of a user across the room.

- `Room`: image-source impulse responses (pyroomacoustics) from the loudspeaker and from the user to
  the microphone, in a shoebox room with a chosen reverberation time. `moved()` is the same room
  after someone moved: the user and the furniture, so the loudspeaker's response changes.
- `Convolver`: uniformly partitioned FFT convolution (overlap-save), one block in, one block out, the
  response swappable between blocks with a crossfade (a path change while audio runs).
- `RoomMic`: everything after the loudspeaker's input up to the microphone's output, a block at a
  time: a mild loudspeaker nonlinearity, the room, the user's voice through its own path, and
  microphone noise. The JACK room client and scripts/bench/echo.py both run it.

Everything is seeded: the same arguments give the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 24000
DIMS = (4.6, 3.7, 2.6)
"""The room, in metres: a living room or a kitchen."""
SPEAKER = (2.1, 1.4, 1.0)
"""The device on a table: its loudspeaker..."""
MIC_OFFSET = (0.06, 0.03, 0.0)
"""...and its microphone 6.7 cm away, so the echo is louder than any user across the room."""
USER = (3.5, 2.8, 1.6)


@dataclass(frozen=True)
class Responses:
    speaker: np.ndarray
    """Loudspeaker -> microphone, float32."""
    user: np.ndarray
    """User -> microphone, float32."""


class Room:
    def __init__(self, rt60: float, *, seed: int = 0, rate: int = RATE) -> None:
        self.rt60, self.seed, self.rate = rt60, seed, rate

    def responses(self, *, moved: bool = False) -> Responses:
        """The impulse responses; `moved`: after a path change (another furniture layout nearby, the
        device turned a little, the user elsewhere)."""
        import pyroomacoustics as pra

        rng = np.random.default_rng(self.seed + (1000 if moved else 0))
        dims = np.array(DIMS) * (1 + rng.uniform(-0.08, 0.08, 3))
        absorption, order = pra.inverse_sabine(self.rt60, dims)
        room = pra.ShoeBox(dims, fs=self.rate, materials=pra.Material(absorption), max_order=order)
        speaker = np.array(SPEAKER) + rng.uniform(-0.15, 0.15, 3) * (1 if moved else 0)
        turn = rng.uniform(-0.6, 0.6) if moved else 0.0  # the device turned: the microphone's offset rotates
        c, s = np.cos(turn), np.sin(turn)
        offset = np.array([c * MIC_OFFSET[0] - s * MIC_OFFSET[1], s * MIC_OFFSET[0] + c * MIC_OFFSET[1], MIC_OFFSET[2]])
        user = np.array(USER) + rng.uniform(-0.4, 0.4, 3)
        room.add_source(speaker)
        room.add_source(np.clip(user, 0.3, dims - 0.3))
        room.add_microphone(speaker + offset)
        room.compute_rir()
        speaker_ir = np.asarray(room.rir[0][0], dtype=np.float64)
        user_ir = np.asarray(room.rir[0][1], dtype=np.float64)
        if moved:  # a person standing near the device: a strong early reflection (0.5-1.5 m more path)
            delay = int(rng.uniform(0.0015, 0.0045) * self.rate)
            speaker_ir = speaker_ir.copy()
            peak = int(np.argmax(np.abs(speaker_ir)))
            speaker_ir[peak + delay:] += 0.35 * speaker_ir[peak:len(speaker_ir) - delay]
        return Responses(speaker_ir.astype(np.float32), user_ir.astype(np.float32))


class Convolver:
    """Uniformly partitioned overlap-save convolution, `block` samples per call; the response can
    change between calls (`set`), crossfaded over one block."""

    def __init__(self, response: np.ndarray, block: int, max_len: int | None = None) -> None:
        self.block = block
        self.parts = -(-(max_len or len(response)) // block)
        self.spectra = np.zeros((self.parts, block + 1), dtype=np.complex128)
        self.old = np.zeros_like(self.spectra)
        self.history = np.zeros((self.parts, block + 1), dtype=np.complex128)
        """Spectra of the last `parts` input frames, the newest first."""
        self.frame = np.zeros(2 * block)
        self.fade = np.linspace(0.0, 1.0, block, endpoint=False)
        self.fading = False
        self.set(response, crossfade=False)

    def set(self, response: np.ndarray, *, crossfade: bool = True) -> None:
        b = self.block
        padded = np.zeros(self.parts * b)
        n = min(len(response), len(padded))
        padded[:n] = response[:n]
        self.old[:] = self.spectra
        self.spectra[:] = np.fft.rfft(np.pad(padded.reshape(self.parts, b), ((0, 0), (0, b))), axis=1)
        self.fading = crossfade

    def __call__(self, x: np.ndarray) -> np.ndarray:
        b = self.block
        self.frame[:b] = self.frame[b:]
        self.frame[b:] = x
        self.history[1:] = self.history[:-1]
        self.history[0] = np.fft.rfft(self.frame)
        y = np.fft.irfft((self.spectra * self.history).sum(axis=0), 2 * b)[b:]
        if self.fading:
            y_old = np.fft.irfft((self.old * self.history).sum(axis=0), 2 * b)[b:]
            y = self.fade * y + (1 - self.fade) * y_old
            self.fading = False
        return y


def loudspeaker(x: np.ndarray, drive: float = 1.0) -> np.ndarray:
    """A small loudspeaker driven hard: soft clipping that compresses peaks (-0.6 dB at half
    scale, -2.3 dB at full scale), a little second-order distortion, unity gain for small signals."""
    return (np.tanh(drive * x) / drive + 0.01 * x * np.abs(x)).astype(np.float32)


def unit(response: np.ndarray) -> np.ndarray:
    """The response scaled to unit energy: its echo has the level of what the loudspeaker plays."""
    return (response / np.sqrt(np.sum(response.astype(np.float64) ** 2))).astype(np.float32)


def convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """x through h, as long as x (float64)."""
    from scipy.signal import fftconvolve

    return fftconvolve(x.astype(np.float64), h.astype(np.float64))[:len(x)]


def active_rms(x: np.ndarray) -> float:
    """RMS over the 10 ms frames within 30 dB of the loudest (speech, not its pauses)."""
    frames = x[:len(x) // 240 * 240].reshape(-1, 240).astype(np.float64)
    power = (frames ** 2).mean(axis=1)
    return float(np.sqrt(power[power > power.max() * 1e-3].mean()))


FORECAST = ("Here is the forecast for the rest of the week. Tomorrow starts cloudy with a chance of light rain in "
            "the morning, clearing by the afternoon with highs around eighteen degrees. On Thursday the sun "
            "returns, and the weekend looks warm and dry.")
"""What the daemon says in the room rig (tests/audio/test_room.py, scripts/bench/bargein.py and
echo_timings.py): espeak-ng speech of it, at VOICE_DBFS."""
VOICE_DBFS = -24.0
"""The daemon's voice at the loudspeaker's input: its active level (`active_rms`), dBFS."""


def at_voice_level(speech: np.ndarray) -> np.ndarray:
    """`speech` scaled to VOICE_DBFS active level, float32."""
    return (speech / active_rms(speech) * 10 ** (VOICE_DBFS / 20)).astype(np.float32)


class RoomMic:
    """The microphone's signal, a block at a time, from what the loudspeaker is given.

    The loudspeaker's path has unit energy times echo_gain (the echo's level at the microphone); the
    user's voice (`say`) goes through the user's path at user_gain; noise_dbfs is the microphone's
    white noise."""

    def __init__(self, room: Room, block: int, *, echo_gain: float = 1.0, user_gain: float = 1.0,
                 noise_dbfs: float = -62.0, seed: int = 0) -> None:
        self.room, self.block = room, block
        self.paths = room.responses()
        longest = max(len(self.paths.speaker), len(self.paths.user)) + 4 * block
        self.echo = Convolver(unit(self.paths.speaker) * echo_gain, block, longest)
        self.user = Convolver(self.paths.user * user_gain, block, longest)
        self.echo_gain = echo_gain
        self.noise = 10 ** (noise_dbfs / 20) * np.sqrt(3)  # uniform noise of that RMS
        self.rng = np.random.default_rng(seed)
        self.voice: np.ndarray | None = None
        self.voice_pos = 0
        self.zeros = np.zeros(block, dtype=np.float32)

    def move(self) -> None:
        """A path change: the loudspeaker's response becomes the moved room's, from the next block."""
        self.echo.set(unit(self.room.responses(moved=True).speaker) * self.echo_gain)

    def say(self, pcm: np.ndarray) -> None:
        self.voice, self.voice_pos = pcm, 0

    def __call__(self, out: np.ndarray) -> np.ndarray:
        """One block: the loudspeaker's input -> the microphone's output (float32)."""
        b = self.block
        user = self.zeros
        if self.voice is not None and self.voice_pos < len(self.voice):
            user = np.zeros(b, dtype=np.float32)
            n = min(b, len(self.voice) - self.voice_pos)
            user[:n] = self.voice[self.voice_pos:self.voice_pos + n]
            self.voice_pos += n
        mic = self.echo(loudspeaker(out)) + self.user(user)
        mic += self.rng.uniform(-self.noise, self.noise, b)
        return mic.astype(np.float32)
