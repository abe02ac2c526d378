"""The history owner: one thread holding every session's turns (SQLite), each reply's cursor, and
the calibration component; the only writer of assistant turns.

Commands come through `inbox` from the server thread (`Reserve` when a speak with a session
arrives, so its slot comes before anything the client sends after it; `Ack`, `AddTurn`, `Query`),
from the cohort loop (`Unreserve` for a rejected speak, `Ended` when a reply is over: generated,
and played out when it played on the daemon's speaker) and from calibration runs (`Finished`).
Replies to clients leave through this thread's own PUSH socket into the server's reply pipe.

An assistant turn's text is always recomputed from the reply's original text and its current
evidence, never cut from an earlier cut:
- the reply ended and was heard to the end of a complete (eos) reply: the whole text;
- a calibrated heard prefix, while the cutoff is still at or beyond the evidence it came from;
- otherwise nothing ("", interrupted): all or nothing, until a calibration says more.
The cutoff is min(played, generated, the strictest final cursor). Ordinary acks only move `played`
forward; a final ack (or the local speaker's end) confirms the cursor and may lower it (a stricter
truncation, which clears a heard prefix until new evidence comes).

A write or read the database refuses (the disk full, the file unwritable) never stops the thread:
the client it concerns gets an `error` naming what was not saved (with the speak's id where there
is one), the log says it, and `status` counts it with the last error.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import zmq

from edged import protocol as wire
from edged.history.calibration import Calibration, Evidence, Finished, Policy
from edged.history.rates import VoiceRates
from edged.history.store import Store

log = logging.getLogger("edged.history")

INF = 1 << 62
MAX_RECORDS = 4096
"""Replies whose cursor and evidence are kept in memory (acks for older ones are ignored)."""


# --------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Reserve:
    client: bytes
    id: Any
    session: str
    text: str
    voice: str | None
    local: bool
    """Played on the daemon's speaker: its DAC cursor is the evidence (client acks are ignored)."""
    reservation: int = 0
    """This speak's number (the router counts them): its Unreserve names it, so a rejected duplicate
    of an id in flight takes back its own slot, not the reply's it duplicated."""


@dataclass(frozen=True)
class Unreserve:
    client: bytes
    id: Any
    reservation: int = 0


@dataclass(frozen=True)
class Ended:
    client: bytes
    id: Any
    reason: str
    generated_ms: int
    played_ms: int | None
    """The local speaker's final cursor; None when the reply did not play on it."""
    pcm: np.ndarray | None
    sample_rate: int
    text: str | None = None
    """A streamed reply's whole text (everything received); None: the speak's text."""


@dataclass(frozen=True)
class Ack:
    client: bytes
    ack: wire.Ack


@dataclass(frozen=True)
class AddTurn:
    client: bytes
    turn: wire.Turn


@dataclass(frozen=True)
class Query:
    client: bytes
    history: wire.History


@dataclass(frozen=True)
class Stop:
    pass


# --------------------------------------------------------------------------------------- a reply


@dataclass
class Record:
    key: Hashable
    id: Any
    session: str
    turn_id: int
    text: str
    voice: str | None
    local: bool
    ended: bool = False
    complete: bool = False
    """The reply finished (eos): all of its text was spoken."""
    reservation: int = 0
    previous: Record | None = None
    """The record this one's reservation replaced under the same key, until the speak is known to be
    admitted: a rejected one gives its key back to it (one level: an older one is let go)."""
    generated_ms: int = 0
    played_ms: int = 0
    cap_ms: int = INF
    """The strictest final cursor (only tightens)."""
    confirmed: bool = False
    heard: tuple[int, int] | None = None
    """(offset into the text, evidence_ms) from a calibration run."""

    @property
    def cutoff_ms(self) -> int:
        return max(0, min(self.played_ms, self.generated_ms if self.ended else INF, self.cap_ms))

    @property
    def fully_heard(self) -> bool:
        return self.ended and self.complete and self.cutoff_ms >= self.generated_ms

    def content(self) -> tuple[str, bool]:
        """(heard text, interrupted) from the original text and the current evidence."""
        if self.fully_heard:
            return self.text, False
        if self.heard is not None and self.cutoff_ms >= self.heard[1]:
            return self.text[:self.heard[0]].rstrip(), True
        return "", True


@dataclass
class _Waiter:
    client: bytes
    session: str
    deadline: float


class History:
    def __init__(self, store: Store, policy: Policy | None, rates: VoiceRates, *, context: zmq.Context, replies: str,
                 max_bytes: int = 8 << 20, timeout_s: float = 1.0, wait_s: float = 2.0) -> None:
        self.store = store
        self.policy = policy
        self.rates = rates
        self.context, self.replies_endpoint = context, replies
        self.wait_s = wait_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.calibration = Calibration(policy, self.inbox.put, max_bytes=max_bytes, timeout_s=timeout_s) \
            if policy is not None else None
        self.records: dict[Hashable, Record] = {}
        self.waiters: list[_Waiter] = []
        self.snapshot: dict[str, Any] = {}
        """The thread's counters for `status` (rebuilt by the history thread; read anywhere)."""
        self.errors = 0
        self.last_error: str | None = None
        """Writes or reads the database refused, and the last refusal."""
        self._thread = threading.Thread(target=self._run, name="edged-history", daemon=True)
        self._recover()
        self._count()

    def _recover(self) -> None:
        """Assistant turns left pending by a crash: nobody knows what was heard, so nothing was."""
        for turn in self.store.pending():
            self.store.update(turn.id, "", interrupted=True, pending=False)
            log.warning("history: a reply of session %s did not end before the daemon stopped; kept as unheard",
                        turn.session)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(Stop())
        self._thread.join(timeout=5)

    # ----------------------------------------------------------------------------- from the loop

    def unreserve(self, client: bytes, id: Any, reservation: int) -> None:
        """A speak with a session was rejected: its reserved slot goes."""
        self.inbox.put(Unreserve(client, id, reservation))

    def ended(self, client: bytes, id: Any, reason: str, generated_ms: int, played_ms: int | None,
              pcm: np.ndarray | None, sample_rate: int, text: str | None = None) -> None:
        """A reply is over (sent before its `done`, so whatever the client sends after it comes
        after); `text`: a streamed reply's whole text."""
        self.inbox.put(Ended(client, id, reason, generated_ms, played_ms, pcm, sample_rate, text))

    # ----------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        self._push = self.context.socket(zmq.PUSH)
        self._push.connect(self.replies_endpoint)
        try:
            while True:
                try:
                    command = self.inbox.get(timeout=self._timeout())
                except queue.Empty:
                    command = None
                if isinstance(command, Stop):
                    break
                if command is not None:
                    self._command(command)
                self._tick()
                self._forget_old()
                self._count()
        finally:
            if self.calibration is not None:
                self.calibration.close()
            self._push.close(linger=1000)
            self.store.close()

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [w.deadline for w in self.waiters]
        if self.calibration is not None and self.calibration.tasks:
            deadlines += [t.deadline for t in self.calibration.tasks.values()]
        return max(0.0, min(deadlines) - now) if deadlines else 0.5

    def _tick(self) -> None:
        now = time.monotonic()
        if self.calibration is not None:
            self.calibration.expire(now)
        for waiter in list(self.waiters):
            busy = self.calibration is not None and self.calibration.pending(waiter.session)
            if busy and now < waiter.deadline:
                continue
            if busy and self.calibration is not None:  # the prompt's deadline: late results are refused
                log.warning("history: %d calibration(s) of session %s still running at the prompt's deadline",
                            self.calibration.revoke(waiter.session), waiter.session)
            self.waiters.remove(waiter)
            try:
                self._answer(waiter.client, waiter.session)
            except sqlite3.Error as exc:
                self._refused(waiter.client, None, f"session {waiter.session!r} could not be read", exc)

    def _reply(self, client: bytes, message: Any) -> None:
        self._push.send_multipart([client, *wire.encode(message)], copy=True)

    def _command(self, c: Any) -> None:
        try:
            self._dispatch(c)
        except sqlite3.Error as exc:
            client, id, what = self._about(c)
            self._refused(client, id, what, exc)

    def _refused(self, client: bytes | None, id: Any, what: str, exc: sqlite3.Error) -> None:
        """The database refused: counted, logged, and told to the client it concerns."""
        self.errors += 1
        self.last_error = f"{what}: {exc}"
        log.error("history: %s (%s)", what, exc, extra={"request_id": "" if id is None else str(id)})
        if client is not None:
            self._reply(client, wire.Error(f"history: {what} ({exc})", id))

    def _about(self, c: Any) -> tuple[bytes | None, Any, str]:
        """(client, id, what was not done) of a command the database refused."""
        if isinstance(c, Reserve):
            return c.client, c.id, f"the reply {c.id!r} of session {c.session!r} was not saved"
        if isinstance(c, (Ended, Unreserve)):
            return c.client, c.id, f"the turn of reply {c.id!r} was not saved"
        if isinstance(c, Ack):
            return c.client, c.ack.id, f"the heard text of reply {c.ack.id!r} was not saved"
        if isinstance(c, AddTurn):
            return c.client, None, f"the {c.turn.role} turn of session {c.turn.session!r} was not saved"
        if isinstance(c, Query):
            return c.client, None, f"session {c.history.session!r} could not be read"
        if isinstance(c, Finished) and c.key in self.records:
            record = self.records[c.key]
            client, _ = cast(tuple, record.key)
            return client, record.id, f"the heard text of reply {record.id!r} was not saved"
        return None, None, f"{type(c).__name__} was not saved"

    def _dispatch(self, c: Any) -> None:
        if isinstance(c, Reserve):
            self._reserve(c)
        elif isinstance(c, Unreserve):
            self._unreserve(c)
        elif isinstance(c, Ended):
            self._ended(c)
        elif isinstance(c, Ack):
            self._ack(c)
        elif isinstance(c, AddTurn):
            self.store.append(c.turn.session, c.turn.role, c.turn.content)
        elif isinstance(c, Query):
            self._query(c)
        elif isinstance(c, Finished):
            self._finished(c)

    # ----------------------------------------------------------------------------- replies

    def _reserve(self, c: Reserve) -> None:
        key = (c.client, c.id)
        turn_id = self.store.append(c.session, "assistant", "", original=c.text, response_id=c.id, pending=True)
        previous = self.records.get(key)
        if previous is not None:
            previous.previous = None
        self.records[key] = Record(key, c.id, c.session, turn_id, c.text, c.voice, c.local,
                                   reservation=c.reservation, previous=previous)

    def _unreserve(self, c: Unreserve) -> None:
        """A rejected speak's slot goes; the record it replaced (a reply still in flight whose id it
        duplicated, or a finished one whose acks may still come) gets its key back."""
        key = (c.client, c.id)
        record = self.records.get(key)
        if record is not None and record.reservation == c.reservation:
            self.store.delete(record.turn_id)
            if record.previous is not None:
                self.records[key] = record.previous
            else:
                del self.records[key]
        elif record is not None and record.previous is not None and record.previous.reservation == c.reservation:
            self.store.delete(record.previous.turn_id)
            record.previous = None

    def _ended(self, c: Ended) -> None:
        record = self.records.get((c.client, c.id))
        if record is None:
            return
        if c.text is not None:  # a streamed reply: its original text is everything received
            record.text = c.text
            self.store.set_original(record.turn_id, c.text)
        record.ended, record.complete = True, c.reason == "eos"
        record.generated_ms = c.generated_ms
        if c.played_ms is not None:  # the speaker's cursor: final
            record.played_ms = c.played_ms
            record.cap_ms = min(record.cap_ms, c.played_ms)
            record.confirmed = True
        elif not record.local and not c.generated_ms:
            record.confirmed = True  # nothing was generated: nothing can be heard
        if record.complete:  # all of its text in generated_ms: the voice's speaking rate
            learned = self.rates.learn(record.voice, record.text, c.generated_ms)
            if learned is not None:
                self.store.set_voice_rate(self.rates.name(record.voice), *learned)
        if self.calibration is not None:
            self.calibration.retain(record.session, record.key, c.pcm, c.sample_rate)
        self._settle(record)

    def _ack(self, c: Ack) -> None:
        record = self.records.get((c.client, c.ack.id))
        if record is None or record.local:
            return  # not a reply with a session (or its cursor is the daemon's own speaker)
        played = int(c.ack.played_ms)
        record.played_ms = max(record.played_ms, played)
        if c.ack.final:  # the client's playback of this reply is over: confirmed, possibly stricter
            record.played_ms = played
            record.cap_ms = min(record.cap_ms, played)
            record.confirmed = True
            self._settle(record)
        elif record.ended:
            self._write(record)  # periodic acks never start calibration work

    def _settle(self, record: Record) -> None:
        """Store what the evidence says; start a calibration run if it can say more."""
        self._write(record)
        if not record.ended or not record.confirmed or self.calibration is None:
            return
        if record.fully_heard:
            self.calibration.discard(record.key)  # the whole text stands: the recording is freed
            return
        self.calibration.start(Evidence(record.key, record.session, record.id, record.text, record.cutoff_ms,
                                        record.generated_ms if record.complete else None, record.voice))

    def _finished(self, c: Finished) -> None:
        assert self.calibration is not None
        result = self.calibration.accept(c)
        record = self.records.get(c.key)
        if result is None or record is None:
            return
        offset, evidence_ms = result
        if not (record.ended and 0 <= offset <= len(record.text) and 0 < evidence_ms <= record.cutoff_ms):
            log.info("history: calibration result out of range or beyond the current cutoff; refused")
            return
        record.heard = (offset, evidence_ms)
        self._write(record)

    def _write(self, record: Record) -> None:
        content, interrupted = record.content() if record.ended else ("", False)
        self.store.update(record.turn_id, content, interrupted=interrupted, pending=not record.ended)

    # ----------------------------------------------------------------------------- queries

    def _query(self, c: Query) -> None:
        session = c.history.session
        if c.history.wait and self.calibration is not None:
            for record in [r for r in self.records.values() if r.session == session]:
                if record.ended and record.confirmed and not record.fully_heard:
                    self._settle(record)
            if self.calibration.pending(session):
                self.waiters.append(_Waiter(c.client, session, time.monotonic() + self.wait_s))
                return
        self._answer(c.client, session)
        if c.history.close:
            self._close(session)

    def _close(self, session: str) -> None:
        """Release everything the session holds (records, recordings, runs); its turns stay on disk."""
        keys = [k for k, r in self.records.items() if r.session == session]
        for key in keys:
            del self.records[key]
        if self.calibration is not None:
            self.calibration.close_session(session, keys)

    def _forget_old(self) -> None:
        """Bound the records kept for acks and calibration: the oldest ended replies go first."""
        ended = [k for k, r in self.records.items() if r.ended]
        for key in ended[:max(0, len(self.records) - MAX_RECORDS)]:
            del self.records[key]
            if self.calibration is not None:
                self.calibration.discard(key)

    def _answer(self, client: bytes, session: str) -> None:
        self._reply(client, wire.HistoryReply(session, [t.wire() for t in self.store.turns(session)]))

    def _count(self) -> None:
        calibration = self.calibration
        self.snapshot = {"state": "degraded" if self.errors else "ok", "errors": self.errors,
                         "last_error": self.last_error,
                         "policy": self.policy.name if self.policy is not None else "none",
                         "path": str(self.store.path), "replies": len(self.records),
                         "calibrating": len(calibration.tasks) if calibration else 0,
                         "retained_bytes": calibration.retained_bytes() if calibration else 0,
                         "waiting_prompts": len(self.waiters),
                         "voice_ms_per_unit": {v: round(ms, 1) for v, (ms, _) in self.rates.snapshot().items()}}
