"""The codec port: append-only codec frames per member slot.

The talker appends one frame per member per step and publishes it before the next step; the
vocoder walks the published frames with its own cursor. Sized once: max_batch x max_seq frames
(a member can never have more frames than KV slots).
"""

from __future__ import annotations

import numpy as np


class CodecPort:
    def __init__(self, max_batch: int, max_frames: int, groups: int):
        self.codes = np.zeros((max_batch, max_frames, groups), dtype=np.int64)  # [B, F, G]
        self.published = np.zeros(max_batch, dtype=np.int64)
        self.closed = np.ones(max_batch, dtype=bool)  # no more frames will come for this slot

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.published.nbytes + self.closed.nbytes

    def open(self, slot: int) -> None:
        self.published[slot] = 0
        self.closed[slot] = False

    def append(self, slot: int, code0, rest: np.ndarray) -> None:
        """Write frame `published[slot]` = [code0, *rest] and publish it."""
        n = self.published[slot]
        row = self.codes[slot, n]
        row[0] = code0
        row[1:] = rest
        self.published[slot] = n + 1

    def close(self, slot: int) -> None:
        self.closed[slot] = True

    def reset(self) -> None:
        self.published[:] = 0
        self.closed[:] = True

    def frames(self, slot: int) -> np.ndarray:
        """The published frames of a slot, [n, G] (a view)."""
        return self.codes[slot, : self.published[slot]]
