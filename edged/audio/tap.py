"""A timed tap on an audio stream: the callback appends every block it handles, with the block's
device time; another thread reads samples back by time.

The speaker's callback taps what it sent to the DAC (silence included) with `outputBufferDacTime`;
the microphone's taps what it captured with `inputBufferAdcTime`. Both are on the PortAudio stream
clock, so the echo canceller can line up what was played with what was heard. The tap overwrites
its oldest samples (it never blocks the callback); a reader asking for samples that are gone, or
not there yet, gets zeros for them. Allocated once; `record` only copies.
"""

from __future__ import annotations

import numpy as np

_BLOCKS = 512
"""Block times kept (one per callback)."""


class Tap:
    def __init__(self, rate: int, seconds: float) -> None:
        self.rate = int(rate)
        self.capacity = max(1, int(seconds * rate))
        self._buf = np.zeros(self.capacity, dtype=np.float32)
        self._written = 0
        self._block_index = np.zeros(_BLOCKS, dtype=np.int64)
        self._block_time = np.zeros(_BLOCKS, dtype=np.float64)
        self._blocks = 0

    @property
    def written(self) -> int:
        return self._written

    # -- the callback ----------------------------------------------------------------------------

    def record(self, block: np.ndarray, time: float) -> None:
        """Append one block (1-D float32) whose first sample is at device time `time`."""
        n = len(block)
        w = self._written
        start = w % self.capacity
        first = min(n, self.capacity - start)
        self._buf[start:start + first] = block[:first]
        if n > first:
            self._buf[:n - first] = block[first:n]
        k = self._blocks % _BLOCKS
        self._block_index[k] = w
        self._block_time[k] = time
        self._written = w + n  # publish the samples before the block
        self._blocks += 1

    # -- readers ---------------------------------------------------------------------------------

    def index_at(self, time: float) -> int | None:
        """The tap index of the sample at device time `time` (None before the first block)."""
        n = self._blocks
        if n == 0:
            return None
        for j in range(n - 1, max(-1, n - _BLOCKS), -1):
            k = j % _BLOCKS
            if self._block_time[k] <= time:
                return int(self._block_index[k] + round((time - self._block_time[k]) * self.rate))
        k = max(0, n - _BLOCKS) % _BLOCKS  # before every block kept: extrapolate from the oldest
        return int(self._block_index[k] + round((time - self._block_time[k]) * self.rate))

    def time_of(self, index: int) -> float | None:
        """Device time of tap index `index`, from the newest block at or before it."""
        n = self._blocks
        for j in range(n - 1, max(-1, n - _BLOCKS), -1):
            k = j % _BLOCKS
            if self._block_index[k] <= index:
                return float(self._block_time[k] + (index - self._block_index[k]) / self.rate)
        return None

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
