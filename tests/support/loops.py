"""Driving a cohort loop in process, as the daemon's loop thread does."""

from __future__ import annotations


def run_until_idle(loop, limit: int = 2000) -> None:
    """Iterations until no request is in flight and nothing waits in the inbox (an idle iteration
    waits for a command, so counting a fixed number of them would mostly wait)."""
    for _ in range(limit):
        loop.iteration()
        if not loop.scheduler.by_key and loop.inbox.empty():
            return
    raise AssertionError("loop did not go idle")
