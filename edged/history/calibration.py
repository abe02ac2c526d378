"""Heard-text calibration: bounded retention of reply audio, and asynchronous runs of a policy that
says how much of an interrupted reply's text the listener heard.

The semantics are vllm-omni's duplex history calibration (see the module's documented behaviour):

- Retention: a reply's PCM is kept whole (it is handed over when the reply ends), per session up to
  `max_bytes`; whole replies are evicted, oldest first. A suffix is never kept as if it started at
  zero: a reply too large for the bound is not kept at all.
- A run starts only for a reply that has ended with a partial, confirmed cursor (`start`); the
  policy gets an immutable `Snapshot` and returns an exclusive offset into the original text, or
  None to keep the default. The same evidence (text, cutoff, audio size) never runs twice, even
  when it failed or timed out; newer evidence replaces a running task (the old one loses ownership).
- Fences: a result counts only if its task still owns the reply, the evidence is unchanged and the
  offset is an int (`accept`); the history owner then checks it against the reply (range, cutoff)
  and applies it. A task past its deadline loses ownership (`expire`); `revoke` drops ownership of
  a session's tasks at once (a prompt's deadline), keeping their versions so they are not retried.

This object belongs to the history thread: every method runs there. Runs execute on a small thread
pool and report back through `post` (the history thread's inbox). Nothing here logs text or audio.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("edged.history")


@dataclass(frozen=True)
class Snapshot:
    """What a policy may look at: nothing in it changes after the run starts."""

    response_id: Any
    text: str
    """The original text of the reply (never a transcript)."""
    pcm: np.ndarray | None
    """float32 mono PCM from the reply's first sample (read-only); None when the policy needs none."""
    sample_rate: int
    """0 when there is no PCM."""
    played_ms: int
    """The confirmed cutoff: how much of the reply's audio the listener heard."""
    complete_ms: int | None
    """The reply's whole duration, only when it finished (eos); None when it was cut short."""
    voice: str | None


class Policy(Protocol):
    name: str
    requires_audio: bool

    def calibrate(self, snapshot: Snapshot) -> int | None: ...


@dataclass(frozen=True)
class Evidence:
    """A reply's state when a run may start; `version` is what makes two runs the same."""

    key: Hashable
    session: str
    response_id: Any
    text: str
    cutoff_ms: int
    complete_ms: int | None
    voice: str | None


@dataclass(frozen=True)
class Finished:
    """A run's end, posted to the history thread."""

    key: Hashable
    token: object
    future: Future


@dataclass
class _Task:
    token: object
    version: tuple
    session: str
    deadline: float
    evidence_ms: int


@dataclass
class _Audio:
    pcm: np.ndarray
    rate: int

    @property
    def size(self) -> int:
        return int(self.pcm.nbytes)


@dataclass
class Calibration:
    policy: Policy
    post: Callable[[Finished], None]
    max_bytes: int = 8 << 20
    timeout_s: float = 1.0
    workers: int = 2
    audio: dict[str, OrderedDict[Hashable, _Audio]] = field(default_factory=dict)
    """session -> reply -> PCM, oldest first."""
    versions: dict[Hashable, tuple] = field(default_factory=dict)
    tasks: dict[Hashable, _Task] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.timeout_s <= 0:
            raise ValueError("calibration: max_bytes and timeout_s must be > 0")
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="edged-calibrate")

    # ----------------------------------------------------------------------------- retention

    def retained_bytes(self, session: str | None = None) -> int:
        sessions = [self.audio.get(session, OrderedDict())] if session is not None else list(self.audio.values())
        return sum(a.size for replies in sessions for a in replies.values())

    def retain(self, session: str, key: Hashable, pcm: np.ndarray | None, rate: int) -> None:
        """Keep a finished reply's whole PCM (when the policy needs audio), evicting whole replies
        of the session, oldest first, to stay within max_bytes. A reply larger than the bound is not
        kept: a suffix is never kept in its place."""
        if self.closed or not self.policy.requires_audio or pcm is None or rate <= 0:
            return
        if pcm.nbytes > self.max_bytes:
            log.info("calibration: a reply's audio (%d bytes) exceeds the retention bound (%d); not kept",
                     pcm.nbytes, self.max_bytes)
            return
        replies = self.audio.setdefault(session, OrderedDict())
        pcm.setflags(write=False)
        replies[key] = _Audio(pcm, rate)
        while self.retained_bytes(session) > self.max_bytes:
            oldest = next(iter(replies))
            self.discard(oldest)

    def discard(self, key: Hashable) -> None:
        """Forget a reply: its audio, its evidence versions and its task (which loses ownership)."""
        for replies in self.audio.values():
            replies.pop(key, None)
        self.versions.pop(key, None)
        self.tasks.pop(key, None)

    # ----------------------------------------------------------------------------- runs

    def start(self, evidence: Evidence) -> bool:
        """Start a run for an ended reply with a partial, confirmed cursor, unless the same evidence
        already ran (or runs), or the policy's inputs are missing. True when a run started."""
        if self.closed or evidence.cutoff_ms <= 0 or not evidence.text:
            return False
        audio = self.audio.get(evidence.session, OrderedDict()).get(evidence.key)
        if self.policy.requires_audio and audio is None:
            return False  # no recording (evicted, too large, or never made): the default stays
        version = (evidence.text, evidence.cutoff_ms, audio.size if audio is not None else 0)
        if self.versions.get(evidence.key) == version:
            return False  # the same evidence never runs twice, whatever became of the first run
        self.versions[evidence.key] = version
        snapshot = Snapshot(evidence.response_id, evidence.text, audio.pcm if audio is not None else None,
                            audio.rate if audio is not None else 0, evidence.cutoff_ms, evidence.complete_ms,
                            evidence.voice)
        token = object()
        self.tasks[evidence.key] = _Task(token, version, evidence.session, time.monotonic() + self.timeout_s,
                                         evidence.cutoff_ms)  # replaces (disowns) a running task
        future = self._pool.submit(self.policy.calibrate, snapshot)
        future.add_done_callback(functools.partial(self._report, evidence.key, token))
        return True

    def _report(self, key: Hashable, token: object, future: Future) -> None:
        """On the worker thread (or here, if it already ended): hand the end to the history thread."""
        self.post(Finished(key, token, future))

    def accept(self, done: Finished) -> tuple[int, int] | None:
        """A run ended: (offset, evidence_ms) when its result may be applied, else None (logged)."""
        task = self.tasks.get(done.key)
        if self.closed or task is None or task.token is not done.token:
            log.info("calibration: result refused (task no longer owns the reply)")
            return None
        del self.tasks[done.key]
        if self.versions.get(done.key) != task.version:
            log.info("calibration: result refused (evidence changed)")
            return None
        try:
            offset = done.future.result()
        except Exception as exc:
            log.warning("calibration: %s run failed: %s", self.policy.name, type(exc).__name__)
            return None
        if offset is None:
            log.info("calibration: %s refused to estimate", self.policy.name)
            return None
        if not isinstance(offset, int) or isinstance(offset, bool):
            log.warning("calibration: %s returned a %s, not an int", self.policy.name, type(offset).__name__)
            return None
        return offset, task.evidence_ms

    def expire(self, now: float) -> float | None:
        """Tasks past their deadline lose ownership (their versions stay: never retried). Returns
        the next deadline, if any."""
        for key in [k for k, t in self.tasks.items() if t.deadline <= now]:
            log.warning("calibration: %s run timed out after %.2f s", self.policy.name, self.timeout_s)
            del self.tasks[key]
        return min((t.deadline for t in self.tasks.values()), default=None)

    def pending(self, session: str) -> bool:
        return any(t.session == session for t in self.tasks.values())

    def revoke(self, session: str) -> int:
        """Drop ownership of every task of the session (a prompt's deadline passed): their late
        results are refused; their evidence is not retried."""
        keys = [k for k, t in self.tasks.items() if t.session == session]
        for key in keys:
            del self.tasks[key]
        return len(keys)

    # ----------------------------------------------------------------------------- closing

    def close_session(self, session: str, keys: list[Hashable]) -> None:
        for key in [*self.audio.pop(session, OrderedDict()).keys(), *keys]:
            self.discard(key)

    def close(self) -> None:
        self.closed = True
        self.audio.clear()
        self.tasks.clear()
        self.versions.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
