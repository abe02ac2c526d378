"""A microphone whose clock drifts from the speaker's: what the loudspeaker played, sampled by a
clock `ppm` parts per million faster (or slower, below zero) than the one it was played by.

A USB microphone beside an I2S or HDMI loudspeaker is two clocks: the echo is the speaker's stream
stretched by the ratio of the two. `Drift` resamples the speaker's stream by that ratio (soxr at
high quality, streaming) into a FIFO: `push` what the loudspeaker played, `pull` what the
microphone sampled, each in its own blocks. The FIFO starts with `delay` samples of silence, so
the microphone's sample m holds the speaker's sample (m - delay) / (1 + ppm 1e-6) (`echo_delay`).
"""

from __future__ import annotations

import numpy as np

RATE = 24000
DELAY = 1280
"""Silence the FIFO starts with: soxr gives its output in bursts of about 800 samples every third
256-sample chunk, and a pull must never wait on it."""


class Drift:
    def __init__(self, ppm: float, *, rate: int = RATE, delay: int = DELAY, seconds: float = 2.0) -> None:
        import soxr

        self.ppm, self.delay = ppm, delay
        self.ratio = 1 + ppm * 1e-6
        self.resampler = soxr.ResampleStream(rate, rate * self.ratio, 1, dtype="float32", quality="HQ")
        self.fifo = np.zeros(int(seconds * rate), dtype=np.float32)
        self.level = delay
        self.pulled = 0

    def push(self, played: np.ndarray) -> None:
        """What the loudspeaker played next (float32), at the speaker's clock."""
        sampled = self.resampler.resample_chunk(played)
        n = len(sampled)
        assert self.level + n <= len(self.fifo), "the microphone stopped pulling"
        self.fifo[self.level:self.level + n] = sampled
        self.level += n

    def pull(self, out: np.ndarray) -> None:
        """The microphone's next len(out) samples, at its own clock."""
        n = len(out)
        assert n <= self.level, "the microphone ran ahead of the speaker by more than the FIFO's delay"
        out[:] = self.fifo[:n]
        self.fifo[:self.level - n] = self.fifo[n:self.level]
        self.level -= n
        self.pulled += n

    def echo_delay(self) -> float:
        """Microphone samples from the speaker's sample to where the microphone has it, at the
        microphone's next sample: the delay and the drift so far."""
        m = self.pulled
        return m - (m - self.delay) / self.ratio
