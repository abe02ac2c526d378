"""Takes of one measurement on a real audio server, taken again when the audio glitched."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


class Takes:
    """`for take in Takes(glitches): with take: ...` runs the block once, and again (up to `limit`
    times) when it failed (AssertionError) while `glitches()` grew: an audio-server xrun (a cycle
    that missed its deadline drops or shifts a period of the recording) or a speaker underrun, so that
    take measured nothing. A failure without a glitch, or in the last take, is raised; the loop ends
    at the first take that passes. The glitch count is read when the block is entered and left; a
    take after a glitch starts once the audio has been quiet for a while (`settle`)."""

    def __init__(self, glitches: Callable[[], int], limit: int = 3) -> None:
        self.glitches, self.limit = glitches, limit
        self.attempt, self.passed, self.before = 0, False, 0

    def __iter__(self) -> Iterator[Takes]:
        while not self.passed and self.attempt < self.limit:
            if self.attempt:
                settle(self.glitches)
            self.attempt += 1
            yield self

    def __enter__(self) -> Takes:
        self.before = self.glitches()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            self.passed = True
            return False
        if not issubclass(kind, AssertionError) or self.attempt == self.limit:
            return False
        grew = self.glitches() - self.before
        if grew == 0:
            return False
        print(f"\ntake {self.attempt} failed ({exc}) after {grew} audio glitches (xruns, underruns); again")
        return True


def settle(glitches: Callable[[], int], quiet_s: float = 2.0, timeout_s: float = 60.0) -> None:
    """Waits until `glitches()` has not grown for `quiet_s` (the machine's burst of load is over),
    or `timeout_s` has passed; what follows is measured either way."""
    deadline = time.monotonic() + timeout_s
    count, since = glitches(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = glitches()
        if now != count:
            count, since = now, time.monotonic()
