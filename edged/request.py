"""What a client asks for: one utterance to speak, and how to sample it.

Code 0 (the talker) uses temperature, top_k, top_p and repetition_penalty; the code predictor uses
cp_temperature, cp_top_k and cp_top_p. A temperature of 0 means greedy (argmax).
cp_spec_verify_size is the code predictor's speculative verify window: 0 runs one pass per residual
group; 2..8 lets each pass check W - 1 drafted groups (the sampled distribution is unchanged). The sampling
itself runs inside the graphs (docs/artifact.md); the host only fills uniform noise from the
request's own seeded generator. Values are validated at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

Id = str | int
"""A request id, chosen by the client (protocol ids are strings or integers)."""

SAMPLING_KEYS = ("temperature", "top_k", "top_p", "repetition_penalty", "cp_temperature", "cp_top_k", "cp_top_p",
                 "cp_spec_verify_size", "seed")
MAX_VERIFY_WINDOW = 8
"""The largest code-predictor verify window (1 drawn group + 7 drafts), as the reference allows."""


class SamplingError(ValueError):
    """A sampling value out of range; the message names the field."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.9
    """Code-0 softmax temperature; 0 = greedy."""
    top_k: int = 50
    """Code-0 top-k; 0 = off."""
    top_p: float = 1.0
    """Code-0 nucleus mass in (0, 1]; 1 = off."""
    repetition_penalty: float = 1.05
    """Divides (multiplies, when negative) the logits of code-0 tokens generated before; 1 = off."""
    cp_temperature: float = 0.9
    cp_top_k: int = 50
    cp_top_p: float = 1.0
    cp_spec_verify_size: int = 0
    """The code predictor's verify window: 0 = off (one pass per group), 2..8 = 1 drawn + W-1 drafted groups."""
    seed: int | None = None
    """Seed of the request's noise generator; None = fresh entropy."""

    @classmethod
    def defaults(cls, artifact_sampling: dict[str, float]) -> Sampling:
        s = artifact_sampling
        return cls(temperature=float(s["temperature"]), top_k=int(s["top_k"]), top_p=float(s["top_p"]),
                   repetition_penalty=float(s["repetition_penalty"]), cp_temperature=float(s["cp_temperature"]),
                   cp_top_k=int(s["cp_top_k"]), cp_top_p=float(s["cp_top_p"]),
                   cp_spec_verify_size=int(s.get("cp_spec_verify_size", 0)))

    @classmethod
    def greedy(cls) -> Sampling:
        """Argmax for code 0 and every code-predictor group, no repetition penalty."""
        return cls(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                   cp_temperature=0.0, cp_top_k=0, cp_top_p=1.0)

    def with_overrides(self, overrides: dict[str, Any] | None) -> Sampling:
        """These settings with a request's overrides applied, validated; unknown keys are errors."""
        if not overrides:
            return self.validated()
        unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
        if unknown:
            raise SamplingError(f"unknown sampling key(s): {', '.join(unknown)}")
        return replace(self, **overrides).validated()

    def validated(self) -> Sampling:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "seed":
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                    raise SamplingError(f"sampling.seed must be a non-negative integer, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SamplingError(f"sampling.{f.name} must be a number, got {v!r}")
            if f.name.endswith("top_k") and (not float(v).is_integer() or v < 0):
                raise SamplingError(f"sampling.{f.name} must be a non-negative integer, got {v!r}")
        for name in ("temperature", "cp_temperature"):
            if not 0.0 <= getattr(self, name) <= 100.0:
                raise SamplingError(f"sampling.{name} must be in [0, 100], got {getattr(self, name)}")
        for name in ("top_p", "cp_top_p"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise SamplingError(f"sampling.{name} must be in (0, 1], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise SamplingError(f"sampling.repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        w = self.cp_spec_verify_size
        if not float(w).is_integer() or not (w == 0 or 2 <= w <= MAX_VERIFY_WINDOW):
            raise SamplingError(f"sampling.cp_spec_verify_size must be 0 (off) or an integer in 2..{MAX_VERIFY_WINDOW}, "
                                f"got {w!r}")
        return replace(self, top_k=int(self.top_k), cp_top_k=int(self.cp_top_k), cp_spec_verify_size=int(w))


@dataclass(frozen=True, eq=False)
class ClonedVoice:
    """A voice cloned from a reference recording (a Base checkpoint's speaker encoder and speech
    tokenizer encoder made these): in the prompt, the x-vector takes the speaker row; with the
    reference's text too, the reference's text and codec frames come first (in-context, ICL)."""

    xvector: np.ndarray
    """[H] float32: the speaker encoder's output for the reference."""
    ref_codes: np.ndarray | None = None
    """[T, G] int64: the reference's codec frames (ICL only)."""
    ref_text: str | None = None
    """What the reference says (ICL only)."""
    name: str = ""
    """The enrolled voice's name, for reports ("" for an offline reference)."""
    primed: tuple[np.ndarray, ...] | None = None
    """ICL: the vocoder's state after the reference's frames (the clone encoder computes it once), so
    a reply starts from it instead of decoding them again; None: the reply decodes them."""

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None and bool(self.ref_text)


@dataclass(frozen=True)
class SpeechRequest:
    id: Id
    text: str
    voice: str | None = None
    """Speaker name from the artifact's speakers (case-insensitive); None = no speaker row."""
    language: str | None = None
    """Language name from the artifact's languages, or "auto"/None for no language row."""
    instruct: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    dual_track: bool | None = None
    """The dual-track layout: the text is read one token per frame beside the codec track, instead
    of all text in the prefill. None = the reference's default for the voice: all text in the
    prefill for built-in speakers (generate_custom_voice), the dual track for a cloned voice
    (generate_voice_clone)."""
    max_frames: int | None = None
    """Stop with reason "length" after this many frames (None: as many as the KV cache allows)."""
    more_text: bool = False
    """More text follows in pieces (streamed text input); `text` is the first piece, maybe empty.
    Streamed requests use the dual-track layout."""
    text_filter: str = "none"
    """What the pieces of a streamed text go through before they are spoken: "llm" (edged.llm_text:
    no reasoning, no markdown) or "none". A whole text comes already filtered."""
    context: tuple[tuple[str, str], ...] = ()
    """Earlier turns of the conversation, (role, content), as the thinker saw them (the `segments`
    layout, Qwen3-Omni: user turns become prompt rows; system and assistant turns are dropped, as
    the reference drops them). The `tts` layout takes none."""
    clone: ClonedVoice | None = field(default=None, compare=False)
    """A cloned voice instead of a built-in speaker (`voice` is then only its name)."""
    media: np.ndarray | None = field(default=None, compare=False)
    """The thinker's hidden states [rows, width] of the media placeholders (audio, image, video pad
    tokens) in the context's user turns, one row per placeholder in order (the `segments` layout)."""
