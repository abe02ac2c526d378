"""Enrolled voices on disk: SQLite in the state directory, one row per voice.

A voice is what the clone encoder made of its reference: the x-vector and, for in-context voices,
the reference's codec frames and text. Those only mean something to the artifact that made them,
so each row names it (`fingerprint`); a daemon booted with another artifact does not load them
(and says so). The reference recording itself is kept only when configured (`voices.keep_reference`).
Every write is its own transaction, committed before the call returns (WAL, synchronous=NORMAL).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.artifact import Artifact
from edged.request import ClonedVoice

SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    name TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    created REAL NOT NULL,
    reference_ms INTEGER NOT NULL,
    ref_text TEXT,
    xvector BLOB NOT NULL,
    ref_codes BLOB,
    frames INTEGER NOT NULL DEFAULT 0,
    reference BLOB
);
"""


def fingerprint(artifact: Artifact) -> str:
    """What ties a voice to the artifact that encoded it: its manifest and its clone encoder's
    graphs (size and first MiB: cheap at boot, and different for any other export)."""
    h = hashlib.sha256((artifact.path / "artifact.json").read_bytes())
    for role in ("speaker_encoder", "codec_encoder"):
        path = artifact.file(role)
        h.update(str(path.stat().st_size).encode())
        with path.open("rb") as f:
            h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Stored:
    voice: ClonedVoice
    created: float
    reference_ms: int


class VoiceStore:
    def __init__(self, path: Path, artifact: Artifact):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fingerprint = fingerprint(artifact)
        self.hidden, self.groups = artifact.dims.hidden, artifact.dims.code_groups
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def load(self) -> tuple[dict[str, Stored], list[str]]:
        """This artifact's voices by name, and the names of voices another artifact made."""
        mine, others = {}, []
        for name, fp, created, ms, ref_text, xvector, codes, frames in self.db.execute(
                "SELECT name, fingerprint, created, reference_ms, ref_text, xvector, ref_codes, frames FROM voices"):
            if fp != self.fingerprint:
                others.append(name)
                continue
            xv = np.frombuffer(xvector, np.float32).copy()
            ref = None if codes is None else np.frombuffer(codes, np.int64).reshape(frames, self.groups).copy()
            mine[name] = Stored(ClonedVoice(xv, ref, ref_text, name), created, ms)
        return mine, others

    def add(self, voice: ClonedVoice, reference_ms: int, reference: bytes | None) -> Stored:
        """Store a new voice (its name must be free: sqlite3.IntegrityError otherwise)."""
        codes = voice.ref_codes
        created = time.time()
        self.db.execute(
            "INSERT INTO voices (name, fingerprint, created, reference_ms, ref_text, xvector, ref_codes, frames, "
            "reference) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (voice.name, self.fingerprint, created, reference_ms, voice.ref_text,
             voice.xvector.astype(np.float32).tobytes(), None if codes is None else codes.astype(np.int64).tobytes(),
             0 if codes is None else len(codes), reference))
        return Stored(voice, created, reference_ms)

    def remove(self, name: str) -> bool:
        return self.db.execute("DELETE FROM voices WHERE name = ?", (name,)).rowcount > 0

    def close(self) -> None:
        self.db.close()
