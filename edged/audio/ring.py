"""A single-producer single-consumer float32 PCM ring, allocated once.

The producer (one thread) calls `write`; the consumer (the audio callback) calls `read_into` and
`discard`. Each side owns one monotonically increasing counter and only reads the other's, so
neither side locks or allocates: a counter is published after the copy it covers.
"""

from __future__ import annotations

import numpy as np


class PcmRing:
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"ring capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self._buf = np.zeros(self.capacity, dtype=np.float32)
        self._written = 0
        """Samples ever written (owned by the producer)."""
        self._read = 0
        """Samples ever consumed, read or discarded (owned by the consumer)."""

    @property
    def written(self) -> int:
        return self._written

    @property
    def read(self) -> int:
        return self._read

    def available(self) -> int:
        """Samples the consumer can read now."""
        return self._written - self._read

    def free(self) -> int:
        """Samples the producer can write now."""
        return self.capacity - (self._written - self._read)

    # -- producer side --------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the ring; only while no consumer uses it."""
        self._read = self._written = 0

    def write(self, samples: np.ndarray) -> int:
        """Copy as many of `samples` (1-D float32) as fit; returns how many. Never blocks."""
        w = self._written
        n = min(len(samples), self.capacity - (w - self._read))
        if n <= 0:
            return 0
        start = w % self.capacity
        first = min(n, self.capacity - start)
        self._buf[start:start + first] = samples[:first]
        if n > first:
            self._buf[:n - first] = samples[first:n]
        self._written = w + n  # publish after the copy
        return n

    # -- consumer side --------------------------------------------------------------------------

    def read_into(self, out: np.ndarray) -> int:
        """Copy up to len(out) samples into `out` (1-D float32); returns how many. Never blocks."""
        r = self._read
        n = min(len(out), self._written - r)
        if n <= 0:
            return 0
        start = r % self.capacity
        first = min(n, self.capacity - start)
        out[:first] = self._buf[start:start + first]
        if n > first:
            out[first:n] = self._buf[:n - first]
        self._read = r + n  # publish after the copy
        return n

    def peek(self, count: int) -> np.ndarray:
        """A view of up to `count` readable samples, contiguous in the buffer (so maybe fewer than
        available); pair with `discard` for the ones used. No copy."""
        r = self._read
        start = r % self.capacity
        n = max(0, min(count, self._written - r, self.capacity - start))
        return self._buf[start:start + n]

    def clear(self) -> None:
        """Consumer side: drop everything readable."""
        self._read = self._written

    def discard(self, count: int) -> int:
        """Drop up to `count` readable samples without copying; returns how many."""
        n = max(0, min(count, self._written - self._read))
        self._read += n
        return n
