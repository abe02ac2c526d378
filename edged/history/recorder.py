"""Reply audio for calibration: one buffer per cohort slot, allocated at boot, so recording a reply
costs a copy and no allocation on the step path. When the reply's generation ends, `take` copies
it out whole (or says it is too long: a reply is recorded whole or not at all)."""

from __future__ import annotations

import numpy as np


class Recorder:
    def __init__(self, slots: int, max_samples: int) -> None:
        self.buf = np.zeros((slots, max_samples), dtype=np.float32)
        self.samples = [0] * slots
        self.overflow = [False] * slots
        self.active = [False] * slots

    @property
    def claimed_bytes(self) -> int:
        return int(self.buf.nbytes)

    def start(self, slot: int) -> None:
        self.samples[slot], self.overflow[slot], self.active[slot] = 0, False, True

    def write(self, slot: int, first_sample: int, pcm: np.ndarray) -> None:
        if not self.active[slot]:
            return
        end = first_sample + len(pcm)
        if end > self.buf.shape[1]:
            self.overflow[slot] = True
            return
        self.buf[slot, first_sample:end] = pcm
        self.samples[slot] = end

    def take(self, slot: int) -> np.ndarray | None:
        """The slot's reply, copied out; None when it was not recorded or did not fit."""
        if not self.active[slot]:
            return None
        self.active[slot] = False
        return None if self.overflow[slot] else self.buf[slot, :self.samples[slot]].copy()
