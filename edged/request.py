"""What a client asks for: one utterance to speak."""

from __future__ import annotations

from dataclasses import dataclass, field

from edged.talker.sampling import Sampling


@dataclass(frozen=True)
class SpeechRequest:
    id: str | int
    """Chosen by the client (protocol ids are strings or integers)."""
    text: str
    voice: str | None = None
    """Speaker name from the artifact's speakers (case-insensitive); None = no speaker row."""
    language: str | None = None
    """Language name from the artifact's languages, or "auto"/None for no language row."""
    instruct: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    streaming_text: bool = False
    """Dual-track text feed (one text token per frame) instead of all text in the prefill."""
    max_frames: int | None = None
    """Stop with reason "length" after this many frames (None: as many as the KV cache allows)."""
