"""Takes of one measurement on a real audio server, taken again only when the audio server glitched."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


class Takes:
    """`for take in Takes(xruns, underruns): with take: ...` runs the block once, and again (up to
    `limit` times) when it failed (AssertionError) while `xruns()` grew: the audio server missed a
    cycle's deadline inside the measured span, which drops or shifts a period of the recording, so
    that take measured nothing. Nothing else excuses a failure: not the daemon's own speaker
    underruns, which are what a pacing regression looks like. `underruns()` (the speaker's, when
    given) must not grow in a take unless the server's xruns did (an xrun starves every client):
    a take where it does fails, passed or not. The counts are read when the block is entered and
    left; a take after a glitch starts once the server has been quiet for a while (`settle`)."""

    def __init__(self, xruns: Callable[[], int], underruns: Callable[[], int] | None = None, limit: int = 3) -> None:
        self.xruns, self.underruns, self.limit = xruns, underruns, limit
        self.attempt, self.passed = 0, False
        self.before = self.underran = 0

    def __iter__(self) -> Iterator[Takes]:
        while not self.passed and self.attempt < self.limit:
            if self.attempt:
                settle(self.xruns)
            self.attempt += 1
            yield self

    def __enter__(self) -> Takes:
        self.before = self.xruns()
        self.underran = self.underruns() if self.underruns is not None else 0
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        xruns = self.xruns() - self.before
        underruns = self.underruns() - self.underran if self.underruns is not None else 0
        if kind is not None and issubclass(kind, AssertionError) and xruns and self.attempt < self.limit:
            print(f"\ntake {self.attempt} failed ({exc}) after {xruns} audio-server xruns; again")
            return True
        if kind is not None and xruns and exc is not None:
            exc.add_note(f"take {self.attempt} of {self.limit}, after {xruns} audio-server xruns")
        if underruns and not xruns:
            raise AssertionError(f"the speaker underran {underruns} times with no audio-server xrun") from exc
        self.passed = kind is None
        return False


def settle(xruns: Callable[[], int], quiet_s: float = 2.0, timeout_s: float = 60.0) -> None:
    """Waits until `xruns()` has not grown for `quiet_s` (the machine's burst of load is over), or
    `timeout_s` has passed; what follows is measured either way."""
    deadline = time.monotonic() + timeout_s
    count, since = xruns(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = xruns()
        if now != count:
            count, since = now, time.monotonic()
