"""The scheduler: bookkeeping only (no tensors, sockets or clocks), so it tests with plain values.

A request's life is one ordered enum, changed here and nowhere else (vLLM's RequestStatus):

    WAITING -> RUNNING -> PLAYING -> FINISHED_*        (everything from FINISHED_EOS on is finished)
                      \\-----------> FINISHED_*         (a reply that is not on the local speaker)

A request waits in a bounded queue, takes the lowest free cohort slot at a frame boundary once it
can start (a streamed request: once its first text is certain), and frees it the moment its
generation ends. A reply on the local speaker then stays PLAYING until the
speaker is through with it. Why a request ended is decided here too, from what the loop reports:

- generation ended (`end`): eos | length | cancelled | error; the first reason given stays;
- the speaker was through (`played`): played to its end keeps the generation's reason; a cut keeps
  the cause of the cut: the user spoke (interrupted), the device failed (error), a cancel arrived
  while it played (cancelled), or generation failed (that reason). A cut while still generating
  stops generation at the next frame boundary with the cut's reason.

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
    PLAYING = 2
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
COMPLETE = (Status.FINISHED_EOS, Status.FINISHED_LENGTH)
"""Generation that reached its end (only a cut on the speaker changes these)."""


@dataclass(eq=False)
class Entry:
    """One request's bookkeeping; `payload` is whatever the loop attaches (never read here)."""

    key: Hashable
    payload: Any = None
    plays: bool = False
    """It is on the local speaker: it finishes when the speaker is through with it."""
    startable: bool = True
    """It can join the cohort (a streamed request is not until its first text is certain)."""
    status: Status = Status.WAITING
    slot: int | None = None
    cancel_requested: bool = False
    ending: Status | None = None
    """Set when generation ends (or a cut decides it first): the status it finishes with."""
    error: str | None = None
    """Why it failed, when it ends with error (the first failure)."""


class Scheduler:
    def __init__(self, max_batch: int, queue_limit: int):
        self.max_batch = max_batch
        self.queue_limit = queue_limit
        self.waiting: deque[Entry] = deque()
        self.running: dict[int, Entry] = {}  # slot -> entry
        self.playing: dict[Hashable, Entry] = {}
        self.by_key: dict[Hashable, Entry] = {}
        """Every request in flight: waiting, running or playing."""

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
        """At a frame boundary: waiting requests that can start take free slots (lowest first), in
        arrival order."""
        joined = []
        for entry in [e for e in self.waiting if e.startable]:
            if len(self.running) >= self.max_batch:
                break
            self.waiting.remove(entry)
            entry.slot = min(set(range(self.max_batch)) - set(self.running))
            entry.status = Status.RUNNING
            self.running[entry.slot] = entry
            joined.append(entry)
        self._check()
        return joined

    def cancel(self, key: Hashable) -> Entry | None:
        """A waiting request finishes at once, a running one at the next boundary (the loop ends it),
        a playing one when its cut has passed the speaker."""
        entry = self.by_key.get(key)
        if entry is None:
            return None
        entry.cancel_requested = True
        if entry.status is Status.WAITING:
            self.waiting.remove(entry)
            self._finish(entry, Status.FINISHED_CANCELLED)
        return entry

    def end(self, entry: Entry, reason: str, error: str | None = None) -> None:
        """A request's generation is over (eos | length | cancelled | error): a running one frees its
        slot; a waiting one (a stream that never started) leaves the queue."""
        assert entry.status in (Status.WAITING, Status.RUNNING), f"{entry.key} ended while {entry.status.name}"
        if entry.status is Status.WAITING:
            self.waiting.remove(entry)
        else:
            assert entry.slot is not None
            del self.running[entry.slot]
        self._decide(entry, FINISHED[reason], error)
        if entry.plays:
            entry.status = Status.PLAYING
            self.playing[entry.key] = entry
            self._check()
        else:
            assert entry.ending is not None
            self._finish(entry, entry.ending)

    def played(self, entry: Entry, cut: str | None, error: str | None = None) -> None:
        """The speaker is through with the reply. cut: None (played to its end) | "stopped" (the
        loop cut it) | "interrupted" (the user spoke) | "error" (the device failed)."""
        assert entry.plays and not entry.status.finished, f"{entry.key} played while {entry.status.name}"
        entry.plays = False
        if entry.status in (Status.WAITING, Status.RUNNING):  # cut before its generation ended
            self._decide(entry, FINISHED[cut] if cut in ("interrupted", "error") else Status.FINISHED_CANCELLED, error)
            entry.cancel_requested = True
            if entry.status is Status.WAITING:  # it never started: it ends now
                self.end(entry, "cancelled")
            self._check()  # a running one ends at the next frame boundary
            return
        assert entry.ending is not None
        if cut in ("interrupted", "error"):
            final = FINISHED[cut]
        elif cut == "stopped" and entry.ending in COMPLETE:
            final = Status.FINISHED_CANCELLED  # only a cancel cuts a complete reply
        else:
            final = entry.ending
        if final is Status.FINISHED_ERROR and entry.error is None:
            entry.error = error
        del self.playing[entry.key]
        self._finish(entry, final)

    def _decide(self, entry: Entry, status: Status, error: str | None) -> None:
        if entry.ending is None:
            entry.ending, entry.error = status, error

    def _finish(self, entry: Entry, status: Status) -> None:
        assert not entry.status.finished, f"{entry.key} finished twice"
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
        assert all(e.status is Status.PLAYING for e in self.playing.values())
        assert len(self.by_key) == len(self.waiting) + len(self.running) + len(self.playing)
