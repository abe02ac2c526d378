"""Two clocks: the echo's delay slides, and the reference follows it.

A microphone and a loudspeaker on their own crystals (a USB microphone beside an I2S or HDMI
loudspeaker) differ by up to a few hundred ppm: at 100 ppm the echo's delay grows or shrinks 2.4
samples a second at 24 kHz. The canceller's filter cannot follow that by adapting: what it cannot
explain slows its step as if it were the user, so the filter falls a sample or two behind, the
residual then follows the echo estimate and is taken for a path change every 2 s or so, and the
echo the canceller expects while it relearns hides a user who speaks then.

So the slide is measured and taken out of the reference before the filter: every measurement
(`measure`, every half second of sound) reads how far the filter's echo moved since the last one
(the phase of the taps' change over the low bins, where a sample's move turns less than a radian),
and the rate the reference is delayed by follows it (a loop of gain GAIN). The reference is read at
a fractional delay by a windowed sinc of 2 * HALF taps (`frame`); with no slide it is read as is,
sample for sample. The filter then sees an echo that stands still.
"""

from __future__ import annotations

import numpy as np

HALF = 16
"""Taps each side of the fractional-delay interpolator (the reference it reads ahead, samples)."""
GAIN = 0.5
"""Share of a measured move taken into the rate at once: the rate settles within a few seconds and
a measurement's noise (the filter relearning, a user's voice) moves it little."""
MAX_PPM = 500.0
"""The most two audio clocks are taken to differ by: a measured move faster than it is no slide (left
to the filter), and the rate is held within it."""
SAME = 0.9
"""A move is a slide only when the taps kept their shape: over the low bins, their magnitudes agree
this well with the last measurement's (a path change or a filter relearning the room is no slide)."""
DEAD_PPM = 2.0
"""A slide slower than this is left to the filter (it follows 0.05 samples a second by adapting), so
one clock reads its reference sample for sample."""
LOW_RAD = 1.0
"""Bins below this angular frequency (radians per sample) measure the move: a move of a sample turns
them by less than a radian, so their phase needs no unwrapping."""


class Slide:
    def __init__(self, block: int, bins: int) -> None:
        self.block = block
        self.omega = np.pi * np.arange(bins) / block
        self.low = slice(1, max(2, int(LOW_RAD * block / np.pi)))
        self.prev: np.ndarray | None = None
        self.prev_blocks = 0
        self.max_rate = MAX_PPM * 1e-6 * block
        self.dead_rate = DEAD_PPM * 1e-6 * block
        self.rate = 0.0
        """Samples the reference's delay grows by per block (negative: shrinks)."""
        self.frac = 0.0
        """The reference's delay beyond the canceller's whole-sample lag, in [0, 1)."""
        self.moves = 0
        """Measurements taken into the rate (moves of taps that kept their shape)."""
        self.taps = np.arange(2 * HALF) - (HALF - 1)

    def reset(self) -> None:
        """A new device: no slide known."""
        self.rate = self.frac = 0.0
        self.prev = None
        self.moves = 0

    def forget(self) -> None:
        """The filter starts over (another lag): its next taps are not a move of these."""
        self.prev = None

    def measure(self, w: np.ndarray, blocks: int) -> None:
        """The filter's taps `w` [parts, bins] now, `blocks` blocks in: the echo's move since the last
        measurement, samples later, is added (times GAIN) to the rate per block."""
        low = self.low
        if self.prev is not None and blocks > self.prev_blocks:
            now = w[:, low]
            turn = np.einsum("kf,kf->f", now, np.conj(self.prev))
            weight = np.abs(turn)
            omega = self.omega[low]
            total = float(np.dot(omega ** 2, weight))
            power = float(np.sqrt(np.sum(np.abs(now) ** 2) * np.sum(np.abs(self.prev) ** 2)))
            if total > 0 and weight.sum() >= SAME * power:
                moved = -float(np.dot(omega * np.angle(turn), weight)) / total / (blocks - self.prev_blocks)
                if abs(moved) <= self.max_rate:  # faster is no pair of clocks
                    self.rate = float(np.clip(self.rate + GAIN * moved, -self.max_rate, self.max_rate))
                    self.moves += 1
        if self.prev is None:
            self.prev = np.empty((w.shape[0], low.stop - low.start), dtype=w.dtype)
        self.prev[:] = w[:, low]
        self.prev_blocks = blocks

    def advance(self) -> int:
        """One block on: the fractional delay grows by the rate; returns the whole samples it passed
        (the canceller's lag moves by them)."""
        if abs(self.rate) < self.dead_rate:
            return 0
        self.frac += self.rate
        whole = int(np.floor(self.frac))
        self.frac -= whole
        return whole

    def frame(self, ref: np.ndarray, end: int, out: np.ndarray) -> None:
        """`out` (2 * block) = the reference up to `end`, delayed a further `frac` of a sample (ref
        must hold HALF - 1 samples past `end`)."""
        n = len(out)
        if self.frac == 0.0:
            out[:] = ref[end - n:end]
            return
        k = self.taps - self.frac
        h = np.sinc(k) * np.cos(np.pi * k / (2 * HALF)) ** 2
        h /= h.sum()
        out[:] = np.convolve(ref[end - n - HALF:end + HALF - 1], h, "valid")
