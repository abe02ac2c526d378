"""The voice owner: one thread that enrolls, removes and lists voices, on engines of its own.

Commands come from the server thread (`VoiceCommand`: a `voice_add`, `voice_remove` or `voices`
message and the client that sent it); replies leave through this thread's own PUSH socket into the
server's reply pipe, like the history thread's. A reference is encoded here, by the clone encoder's
own ONNX Runtime sessions, so the cohort loop never waits for it: running replies only share the
CPU with it (docs/dev/performance.md, "Voice cloning", measures what that costs them).

`VoiceBook` is what the server thread reads when a speak names a voice: this thread replaces its
map whole (one assignment), so a reader never sees half an update.
"""

from __future__ import annotations

import logging
import queue
import re
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import zmq

from edged import protocol as wire
from edged.artifact import Artifact
from edged.audio.wav import from_s16
from edged.backends import EngineError
from edged.clone import BadReference, VoiceEncoder, reference_pcm
from edged.request import ClonedVoice
from edged.voices.store import Stored, VoiceStore

log = logging.getLogger("edged.voices")

NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,47}")
"""A voice name: lowercase letters, digits, '_', '.', '-'; 1-48 characters, starting with a letter
or digit (names are case-insensitive: they are lowercased first)."""


@dataclass(frozen=True)
class VoiceCommand:
    client: bytes
    message: wire.VoiceAdd | wire.VoiceRemove | wire.Voices
    pcm: bytes | None = None


class VoiceBook:
    """The enrolled voices a speak may name (the server thread reads, the voice thread writes)."""

    def __init__(self) -> None:
        self.voices: dict[str, Stored] = {}

    def get(self, name: str | None) -> ClonedVoice | None:
        stored = self.voices.get(name.lower()) if name else None
        return None if stored is None else stored.voice


@dataclass(frozen=True)
class Limits:
    max_voices: int = 32
    min_reference_ms: int = 1000
    max_reference_ms: int = 30000
    keep_reference: bool = False


class VoiceService:
    def __init__(self, artifact: Artifact, encoder: VoiceEncoder, store: VoiceStore, book: VoiceBook,
                 limits: Limits, *, context: zmq.Context, replies: str):
        self.artifact = artifact
        self.encoder = encoder
        self.store = store
        self.book = book
        self.limits = limits
        self.context = context
        self.replies = replies
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.counters = {"added": 0, "removed": 0, "refused": 0}
        self.last_encode_ms = 0.0
        mine, others = store.load()
        book.voices = mine
        if others:
            log.warning("%d enrolled voice(s) were made by another artifact and are not loaded: %s",
                        len(others), ", ".join(sorted(others)))
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="edged-voices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the command in hand and every one queued before this call, then close."""
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.store.close()
        self.encoder.backend.close()

    def status(self) -> dict[str, Any]:
        return {"enrolled": len(self.book.voices), **self.counters, "last_encode_ms": round(self.last_encode_ms, 1)}

    def listing(self) -> list[dict[str, Any]]:
        """Every voice a speak may name: the artifact's speakers, then the enrolled voices by name."""
        return builtin_voices(self.artifact) + [describe(s) for _, s in sorted(self.book.voices.items())]

    # ----------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        self._prime_loaded()
        push = self.context.socket(zmq.PUSH)
        push.connect(self.replies)
        try:
            while (command := self.inbox.get()) is not None:
                reply = self._handle(command)
                push.send_multipart([command.client, *wire.encode(reply)])
        finally:
            push.close(linger=1000)

    def _prime_loaded(self) -> None:
        """The vocoder state of every in-context voice loaded from disk (not stored: computed again,
        here, after the daemon is ready); until then a reply in such a voice decodes its reference
        frames itself."""
        for name, stored in list(self.book.voices.items()):
            voice = stored.voice
            if voice.icl and voice.primed is None:
                assert voice.ref_codes is not None
                primed = replace(voice, primed=self.encoder.prime(voice.ref_codes))
                self.book.voices = {**self.book.voices, name: replace(stored, voice=primed)}

    def _handle(self, command: VoiceCommand) -> Any:
        m = command.message
        try:
            if isinstance(m, wire.Voices):
                return wire.VoicesReply(self.listing(), m.id)
            if isinstance(m, wire.VoiceRemove):
                return self._remove(m)
            return self._add(m, command.pcm)
        except (BadReference, ValueError) as exc:
            self.counters["refused"] += 1
            log.warning("%s refused: %s", m.op, exc)
            return wire.Error(f"{m.op}: {exc}", m.id)
        except sqlite3.Error as exc:
            self.counters["refused"] += 1
            log.error("%s: the voice database refused it: %s", m.op, exc)
            return wire.Error(f"{m.op}: the voice was not saved ({exc})", m.id)
        except EngineError as exc:
            self.counters["refused"] += 1
            log.error("%s: the clone encoder failed: %s", m.op, exc)
            return wire.Error(f"{m.op}: the clone encoder failed ({exc})", m.id)

    def _add(self, m: wire.VoiceAdd, pcm: bytes | None) -> wire.VoiceAdded:
        name = m.name.lower()
        if not NAME.fullmatch(name):
            raise ValueError(f"voice name {m.name!r} is not valid (1-48 of a-z, 0-9, '_', '.', '-', starting with a "
                             f"letter or digit)")
        if name in self.artifact.speakers:
            raise ValueError(f"voice name {m.name!r} is a built-in speaker of this model")
        if name in self.book.voices:
            raise ValueError(f"voice {name!r} exists: remove it first")
        if len(self.book.voices) >= self.limits.max_voices:
            raise ValueError(f"{self.limits.max_voices} voices are enrolled, the most voices.max_voices allows")
        if m.ref_text is not None and not m.ref_text.strip():
            raise ValueError("ref_text is empty (leave it out to clone from the x-vector only)")
        assert pcm is not None  # the protocol requires the frame
        samples = np.frombuffer(pcm, "<f4") if m.format == "f32le" else from_s16(pcm)
        t0 = time.perf_counter()
        audio = reference_pcm(samples, m.sample_rate, self.artifact.sample_rate,
                              min_ms=self.limits.min_reference_ms, max_ms=self.limits.max_reference_ms)
        voice = self.encoder.encode(audio, m.ref_text, name)
        self.last_encode_ms = (time.perf_counter() - t0) * 1e3
        reference_ms = len(samples) * 1000 // m.sample_rate
        stored = self.store.add(voice, reference_ms, pcm if self.limits.keep_reference else None)
        self.book.voices = {**self.book.voices, name: stored}
        self.counters["added"] += 1
        log.info("enrolled voice %s (%s, %d ms reference, encoded in %.0f ms)", name,
                 "in context" if voice.icl else "x-vector only", reference_ms, self.last_encode_ms)
        return wire.VoiceAdded(name, {**describe(stored), "encode_ms": round(self.last_encode_ms, 1)}, m.id)

    def _remove(self, m: wire.VoiceRemove) -> wire.VoiceRemoved:
        name = m.name.lower()
        if name in self.artifact.speakers:
            raise ValueError(f"voice {m.name!r} is a built-in speaker of this model: it cannot be removed")
        if name not in self.book.voices:
            raise ValueError(f"no enrolled voice {m.name!r}")
        self.store.remove(name)
        self.book.voices = {k: v for k, v in self.book.voices.items() if k != name}
        self.counters["removed"] += 1
        log.info("removed voice %s", name)
        return wire.VoiceRemoved(name, m.id)


def builtin_voices(artifact: Artifact) -> list[dict[str, Any]]:
    """The artifact's speakers as `voices` lists them, by name."""
    return [{"name": name, "kind": "builtin", **({"dialect": s.dialect} if s.dialect else {})}
            for name, s in sorted(artifact.speakers.items())]


def describe(stored: Stored) -> dict[str, Any]:
    v = stored.voice
    return {"name": v.name, "kind": "enrolled", "mode": "icl" if v.icl else "xvector",
            "reference_ms": stored.reference_ms, "created": round(stored.created, 3),
            **({"ref_text": v.ref_text} if v.icl else {})}
