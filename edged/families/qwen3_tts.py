"""Qwen3-TTS (the `qwen-tts` package): the `tts` prompt layout over projected text and codec rows."""

from __future__ import annotations

from edged.artifact.manifest import ArtifactError, Dims, Manifest
from edged.families.base import Family, Talking, predictor_table_shapes
from edged.talker.layouts.tts import TEXT, TtsLayout
from edged.talker.prompt import Lookup
from edged.talker.text import TextEncoder

CODEC_SPECIALS = ("codec_pad", "codec_bos", "codec_eos", "codec_think", "codec_nothink", "codec_think_bos",
                  "codec_think_eos")
TEXT_SPECIALS = ("tts_pad", "tts_bos", "tts_eos")
INSTRUCT_MEANS = {"custom_voice": "style", "voice_design": "voice"}
"""By checkpoint type (qwen-tts 0.1.1): generate_custom_voice takes a style instruction (dropped for
the 0.6B model, whose artifact says instruct false), generate_voice_design a description of the
voice; generate_voice_clone (Base) takes none, and a Base artifact says instruct false."""


class Qwen3TTS(Family):
    name = "qwen3_tts"
    optional_graphs: tuple[str, ...] = ("speaker_encoder", "codec_encoder")
    """Voice cloning (Base checkpoints): reference PCM -> x-vector, and -> codec frames."""
    codec_specials: tuple[str, ...] = CODEC_SPECIALS
    text_specials: tuple[str, ...] = TEXT_SPECIALS
    special_keys: tuple[str, ...] = CODEC_SPECIALS + TEXT_SPECIALS
    lead_samples = False
    """Whether the vocoder's streams may start with samples the host drops (audio.lead_samples)."""
    layout_class: type[TtsLayout] = TtsLayout
    eos_blocked_decisions = 2
    """The reference masks eos for the first two code-0 decisions."""

    def check(self, m: Manifest) -> None:
        super().check(m)
        if m.lead_samples and not self.lead_samples:
            raise ArtifactError(f"artifact.json: audio.lead_samples must be 0 for {self.name} (its vocoder returns "
                                f"every sample), got {m.lead_samples}")
        for keys, size, what in ((self.codec_specials, m.dims.vocab, "talker vocab"),
                                 (self.text_specials, m.dims.text_vocab, "text vocab")):
            for k in keys:
                if not 0 <= m.special[k] < size:
                    raise ArtifactError(f"artifact.json: special.{k}={m.special[k]} is outside the {what} ({size})")

    def instruct_means(self, m: Manifest) -> str:
        return INSTRUCT_MEANS.get(m.model_type, "style") if m.supports_instruct else "none"

    def table_shapes(self, dims: Dims) -> dict[str, tuple[int | None, ...]]:
        # text_projected = text_projection(text_embedding(x)) for every text token, computed at export
        return {TEXT: (dims.text_vocab, dims.hidden), "codec_embedding": (dims.vocab, dims.hidden),
                **predictor_table_shapes(dims)}

    def layout(self, artifact) -> TtsLayout:
        return self.layout_class(artifact, TextEncoder(artifact.file("tokenizer")))

    def talking(self, artifact) -> Talking:
        layout = self.layout(artifact)
        sp = artifact.special
        return Talking(layout, eos=sp["codec_eos"], pad=Lookup(TEXT, (sp["tts_pad"],)), text_table=TEXT,
                       text_end=Lookup(TEXT, (sp["tts_eos"],)), eos_blocked_decisions=self.eos_blocked_decisions)


FAMILY = Qwen3TTS()
