"""What the speaker and the microphone share about a stream's life: noticing that its callback has
stopped (the device is lost), retrying a device with a doubling backoff, and how far behind the
device a thread runs (`Lag`)."""

from __future__ import annotations

import time


class Stall:
    """A callback counter that stops moving for `after_s` means the stream is lost."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self.restart()

    def restart(self) -> None:
        """A new stream: its count starts now."""
        self._count, self._since = -1, time.monotonic()

    def lost(self, count: int, now: float) -> bool:
        if count != self._count:
            self._count, self._since = count, now
            return False
        return now - self._since > self.after_s


class Backoff:
    """When to try a device again: first after `min_s`, doubling up to `max_s`, reset on success."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.delay = min_s
        self.next_try = 0.0

    def failed(self) -> float:
        """Schedule the next try; returns the delay until it."""
        delay = self.delay
        self.next_try = time.monotonic() + delay
        self.delay = min(delay * 2, self.max_s)
        return delay

    def succeeded(self) -> None:
        self.delay = self.min_s

    def due(self, now: float) -> bool:
        return now >= self.next_try

    def now(self) -> None:
        """Try at the next chance (the delay is kept)."""
        self.next_try = 0.0


class Lag:
    """How far behind the audio a thread runs: the latest figure and the most over the last
    `window_s` seconds (one slot per second, written in place: nothing is allocated per note)."""

    def __init__(self, window_s: int = 10) -> None:
        self.most = [0.0] * window_s
        self.second = [-1] * window_s
        self.now_ms = 0.0

    def note(self, ms: float, now: float) -> None:
        second = int(now)
        i = second % len(self.most)
        if self.second[i] != second:
            self.second[i], self.most[i] = second, 0.0
        if ms > self.most[i]:
            self.most[i] = ms
        self.now_ms = ms

    def max_ms(self, now: float) -> float:
        recent = int(now) - len(self.most)
        return max((m for m, s in zip(self.most, self.second) if s > recent), default=0.0)
