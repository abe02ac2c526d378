"""Streamed text input: the tokenizer thread, and what the loop keeps per streamed request.

Pieces of text go, in order, to one tokenizer thread (`TextWorker`), which feeds each request's
`TextStream` and puts the ids that became certain back into the loop's inbox (`Committed`). The
loop never tokenizes: it only copies committed ids' rows into the member's text track. A request
holds no cohort slot until its first id is certain; a member whose committed text is used up waits
at frame boundaries, and the time it waited and the frames that waited are counted here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from edged.llm_text import LlmText
from edged.talker.text import Streamed, TextStream

log = logging.getLogger("edged.streams")


@dataclass(frozen=True)
class Committed:
    """From the tokenizer thread: ids of `stream` that no further text can change, in order."""

    key: Hashable
    stream: TextStream
    ids: list[int]
    final: bool
    error: str | None = None


@dataclass
class TextIn:
    """A streamed request's text, as the loop sees it."""

    stream: TextStream
    last_piece_at: float
    filter: LlmText | None = None
    """The text filter the pieces go through before they are spoken (text_filter "llm")."""
    pieces: list[str] = field(default_factory=list)
    """Everything received, as spoken (filtered): the reply's original text for its history."""
    has_text: bool = False
    """A piece that is not empty has come (the speak's own text, or a `text`): from then on the wait
    is for the next piece (daemon.text_timeout_ms), no longer for the first (first_text_timeout_ms)."""
    blank: bool = True
    """Every piece received was blank (before the filter)."""
    ids: list[int] = field(default_factory=list)
    """Committed ids not yet on a member's track (before the request has joined the cohort)."""
    closed: bool = False
    """No more text is taken: the final piece has gone to the tokenizer (sent by the client, or after
    the text timeout), or the stream ended without it (no first text, a filter failure)."""
    final: bool = False
    """Every id is committed."""
    timed_out: str | None = None
    """The config key of the wait that ran out: "daemon.first_text_timeout_ms" or "daemon.text_timeout_ms"."""
    late: bool = False
    """Text came after generation had ended: it was never spoken."""
    wait_frames: int = 0
    """Frames that had to wait for their text (each wait, however long, delays one frame)."""
    wait_ms: float = 0.0
    waiting_since: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def take(self, piece: str, final: bool, now: float) -> str:
        """A piece as it came; what of it is spoken now (the filter may hold some back until later
        pieces, or `final`), kept for the history."""
        self.last_piece_at = now
        self.has_text = self.has_text or bool(piece)
        self.blank = self.blank and not piece.strip()
        spoken = piece if self.filter is None else self.filter.feed(piece) + (self.filter.end() if final else "")
        self.pieces.append(spoken)
        return spoken

    def streamed(self) -> Streamed:
        """What the prefill reads: the committed ids so far (taken: later ids extend the track)."""
        ids, self.ids = tuple(self.ids), []
        return Streamed(self.stream.head, ids, self.final)

    def waiting(self, now: float) -> None:
        """A frame boundary at which the member had no text to read (its next frame waits)."""
        if self.waiting_since is None:
            self.waiting_since = now
            self.wait_frames += 1

    def resumed(self, now: float) -> None:
        if self.waiting_since is not None:
            self.wait_ms += (now - self.waiting_since) * 1e3
            self.waiting_since = None

    def report(self) -> dict:
        self.resumed(time.monotonic())
        out: dict = {"text_wait_ms": round(self.wait_ms, 3), "text_wait_frames": self.wait_frames,
                     "text_timed_out": self.timed_out is not None}
        if self.timed_out is not None:
            out["text_timeout"] = self.timed_out
        return out


class TextWorker:
    """The tokenizer thread: `put` pieces in order; results come back through `inbox`."""

    def __init__(self, inbox: queue.SimpleQueue):
        self.inbox = inbox
        self.pieces: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="edged-text", daemon=True)
        self._thread.start()

    def put(self, key: Hashable, stream: TextStream, text: str, final: bool) -> None:
        self.pieces.put((key, stream, text, final))

    def stop(self) -> None:
        self.pieces.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (piece := self.pieces.get()) is not None:
            key, stream, text, final = piece
            try:
                self.inbox.put(Committed(key, stream, stream.feed(text, final), final))
            except Exception as exc:  # a tokenizer failure fails that request only
                log.error("tokenizing a text piece failed: %s", exc, exc_info=True)
                self.inbox.put(Committed(key, stream, [], True, f"tokenizing the text failed: {exc}"))
