"""A tap on an audio stream: the callback appends every block it handles; another thread reads
samples back by index.

The speaker's callback taps what it sent to the DAC (silence included), the microphone's what it
captured. Both are continuous streams, so the listener lines them up by a fixed offset between the
two indexes (see `Listener._reference`). The tap overwrites its oldest samples (it never blocks the
callback); a reader asking for samples that are gone, or not there yet, gets zeros for them.
Allocated once; `record` only copies.
"""

from __future__ import annotations

import numpy as np


class Tap:
    def __init__(self, rate: int, seconds: float) -> None:
        self.rate = int(rate)
        self.capacity = max(1, int(seconds * rate))
        self._buf = np.zeros(self.capacity, dtype=np.float32)
        self._written = 0

    @property
    def written(self) -> int:
        """Samples ever recorded: the index one past the newest."""
        return self._written

    def record(self, block: np.ndarray) -> None:
        """The callback: append one block (1-D float32)."""
        n = len(block)
        w = self._written
        start = w % self.capacity
        first = min(n, self.capacity - start)
        self._buf[start:start + first] = block[:first]
        if n > first:
            self._buf[:n - first] = block[first:n]
        self._written = w + n  # publish after the copy

    def read(self, index: int, out: np.ndarray) -> None:
        """Copy samples [index, index + len(out)) into `out`; zeros where the tap has none."""
        n = len(out)
        lo = max(index, self._written - self.capacity, 0)
        hi = min(index + n, self._written)
        out[:] = 0.0
        if hi <= lo:
            return
        src = lo % self.capacity
        count = hi - lo
        first = min(count, self.capacity - src)
        dst = lo - index
        out[dst:dst + first] = self._buf[src:src + first]
        if count > first:
            out[dst + first:dst + count] = self._buf[:count - first]
