"""The scheduler: bookkeeping only (no tensors, sockets or clocks), so it tests with plain lists.

A request's life is one ordered enum changed here and nowhere else: WAITING -> RUNNING -> one of
the FINISHED_* states (everything from FINISHED_EOS on is finished). A request waits in a bounded
queue, takes the lowest free cohort slot at a frame boundary, and frees it the moment it finishes.
Invariants are asserted after every change.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED_EOS = 10
    FINISHED_LENGTH = 11
    FINISHED_CANCELLED = 12
    FINISHED_INTERRUPTED = 13
    FINISHED_ERROR = 14

    @property
    def finished(self) -> bool:
        return self >= Status.FINISHED_EOS

    @property
    def reason(self) -> str:
        """The wire name of a finished status: eos | length | cancelled | interrupted | error."""
        return self.name.removeprefix("FINISHED_").lower()


FINISHED = {s.reason: s for s in Status if s.finished}


@dataclass(eq=False)
class Entry:
    """One request's bookkeeping; `payload` is whatever the loop attaches (never read here)."""

    key: Hashable
    payload: Any = None
    status: Status = Status.WAITING
    slot: int | None = None
    cancel_requested: bool = False


class Scheduler:
    def __init__(self, max_batch: int, queue_limit: int):
        self.max_batch = max_batch
        self.queue_limit = queue_limit
        self.waiting: deque[Entry] = deque()
        self.running: dict[int, Entry] = {}  # slot -> entry
        self.by_key: dict[Hashable, Entry] = {}

    def submit(self, entry: Entry) -> str | None:
        """Queue a request; returns a rejection reason instead when it cannot be taken."""
        if entry.key in self.by_key:
            return "duplicate id in flight"
        free_slots = self.max_batch - len(self.running)
        if len(self.waiting) >= self.queue_limit + free_slots:
            return "busy"
        self.waiting.append(entry)
        self.by_key[entry.key] = entry
        self._check()
        return None

    def join(self) -> list[Entry]:
        """At a frame boundary: waiting requests take free slots (lowest first), in arrival order."""
        joined = []
        while self.waiting and len(self.running) < self.max_batch:
            entry = self.waiting.popleft()
            entry.slot = min(set(range(self.max_batch)) - set(self.running))
            entry.status = Status.RUNNING
            self.running[entry.slot] = entry
            joined.append(entry)
        self._check()
        return joined

    def cancel(self, key: Hashable) -> Entry | None:
        """Mark a request cancelled; a waiting one finishes at once, a running one at the next boundary."""
        entry = self.by_key.get(key)
        if entry is None:
            return None
        entry.cancel_requested = True
        if entry.status is Status.WAITING:
            self.waiting.remove(entry)
            self._finish(entry, Status.FINISHED_CANCELLED)
        return entry

    def finish(self, entry: Entry, reason: str) -> None:
        """A running request ends with `reason` (eos | length | cancelled | interrupted | error)."""
        self._finish(entry, FINISHED[reason])

    def _finish(self, entry: Entry, status: Status) -> None:
        assert not entry.status.finished, f"{entry.key} finished twice"
        if entry.slot is not None and self.running.get(entry.slot) is entry:
            del self.running[entry.slot]
        entry.status = status
        del self.by_key[entry.key]
        self._check()

    @property
    def members(self) -> list[Entry]:
        return [self.running[s] for s in sorted(self.running)]

    def _check(self) -> None:
        assert len(self.running) <= self.max_batch
        assert all(e.status is Status.WAITING for e in self.waiting)
        assert all(e.status is Status.RUNNING and e.slot == s for s, e in self.running.items())
        assert len(self.by_key) == len(self.waiting) + len(self.running)
