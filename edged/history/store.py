"""The authoritative history on disk: SQLite in WAL mode, one row per turn.

A turn's place is its row id, taken when the turn is created: an assistant turn is created (as a
reserved slot, `pending`) when its `speak` is accepted, so however late its heard text is known,
it stays before the user turns that came after it. Updates rewrite the row in place. Every write is
its own transaction, committed before the call returns: with WAL and synchronous=NORMAL a committed
turn survives the daemon being killed (kill -9); only a power cut can lose the last ones.

One connection; the daemon's boot opens it and recovers it, then only the history thread uses it.
A file SQLite cannot read (not a database, or a failed quick_check) raises `Corrupt`; `open_store`
then moves it aside (never writing to it) and starts a fresh one, or refuses, as configured.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("edged.history")

CORRUPT_CODES = (11, 26)
"""SQLITE_CORRUPT and SQLITE_NOTADB."""


class Corrupt(sqlite3.DatabaseError):
    """The history file is not a database SQLite can read."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'system', 'assistant')),
    content TEXT NOT NULL,
    original TEXT,
    response_id TEXT,
    interrupted INTEGER NOT NULL DEFAULT 0,
    pending INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session, id);
CREATE TABLE IF NOT EXISTS voice_rates (
    voice TEXT PRIMARY KEY,
    ms_per_unit REAL NOT NULL,
    replies INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class Turn:
    id: int
    session: str
    role: str
    content: str
    original: str | None
    response_id: Any
    interrupted: bool
    pending: bool

    def wire(self) -> dict[str, Any]:
        """The turn as the `history` reply carries it."""
        turn: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            turn["interrupted"] = self.interrupted
            if self.response_id is not None:
                turn["response_id"] = self.response_id
            if self.pending:
                turn["pending"] = True
        return turn


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: each statement is its own transaction. Made on the booting thread, then used by the
        # history thread only (one thread at a time), hence check_same_thread off.
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise Corrupt(f"{self.path}: quick_check says {check}")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            self.db.close()
            if isinstance(exc, Corrupt):  # already names the file
                raise
            if getattr(exc, "sqlite_errorcode", None) in CORRUPT_CODES or "not a database" in str(exc) \
                    or "malformed" in str(exc):
                raise Corrupt(f"{self.path}: {exc}") from exc
            raise

    def append(self, session: str, role: str, content: str, *, original: str | None = None,
               response_id: Any = None, pending: bool = False) -> int:
        cur = self.db.execute(
            "INSERT INTO turns (session, role, content, original, response_id, pending) VALUES (?, ?, ?, ?, ?, ?)",
            (session, role, content, original, None if response_id is None else json.dumps(response_id), int(pending)))
        return int(cur.lastrowid or 0)

    def update(self, turn_id: int, content: str, *, interrupted: bool, pending: bool) -> None:
        self.db.execute("UPDATE turns SET content = ?, interrupted = ?, pending = ? WHERE id = ?",
                        (content, int(interrupted), int(pending), turn_id))

    def set_original(self, turn_id: int, original: str) -> None:
        self.db.execute("UPDATE turns SET original = ? WHERE id = ?", (original, turn_id))

    def delete(self, turn_id: int) -> None:
        self.db.execute("DELETE FROM turns WHERE id = ?", (turn_id,))

    def turns(self, session: str) -> list[Turn]:
        """The session's turns, oldest first."""
        return self._select("session = ?", (session,))

    def pending(self) -> list[Turn]:
        """Assistant turns whose reply had not ended when the daemon last stopped."""
        return self._select("pending = 1", ())

    def _select(self, where: str, args: tuple) -> list[Turn]:
        rows = self.db.execute("SELECT id, session, role, content, original, response_id, interrupted, pending "
                               f"FROM turns WHERE {where} ORDER BY id", args).fetchall()
        return [Turn(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else json.loads(r[5]), bool(r[6]), bool(r[7]))
                for r in rows]

    def voice_rates(self) -> dict[str, tuple[float, int]]:
        return {v: (ms, n) for v, ms, n in self.db.execute("SELECT voice, ms_per_unit, replies FROM voice_rates")}

    def set_voice_rate(self, voice: str, ms_per_unit: float, replies: int) -> None:
        self.db.execute("INSERT INTO voice_rates (voice, ms_per_unit, replies) VALUES (?, ?, ?) "
                        "ON CONFLICT (voice) DO UPDATE SET ms_per_unit = excluded.ms_per_unit, replies = excluded.replies",
                        (voice, ms_per_unit, replies))

    def close(self) -> None:
        self.db.close()


def open_store(path: Path | str, on_corrupt: str) -> Store:
    """The history store at `path`. A corrupt file is never written: with on_corrupt "move" it (and
    its -wal and -shm files) is renamed <name>.corrupt-<UTC time> and a fresh store is started;
    with "refuse" `Corrupt` is raised. Any other SQLite or OS error (unwritable, no space) is raised."""
    path = Path(path)
    try:
        return Store(path)
    except Corrupt as exc:
        if on_corrupt != "move":
            raise
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for suffix in ("", "-wal", "-shm"):
            part = path.with_name(path.name + suffix)
            if part.exists():
                part.rename(path.with_name(f"{path.name}{suffix}.corrupt-{stamp}"))
        log.error("history: %s; moved aside as %s.corrupt-%s, starting a fresh history", exc, path.name, stamp)
        return Store(path)
