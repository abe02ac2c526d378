"""Qwen3-Omni (transformers' `qwen3_omni_moe`): the `segments` prompt layout over the thinker's projected
text rows, the talker's codec rows and the `hidden_projection` of the thinker's hidden states at
media placeholders; its code2wav's streams start with `audio.lead_samples` the host
drops. The graphs and the tables are Qwen3-TTS's (docs/artifact.md)."""

from __future__ import annotations

from edged.families.qwen3_tts import TEXT_SPECIALS, Qwen3TTS
from edged.talker.layouts.segments import MEDIA_TOKENS, SegmentsLayout
from edged.talker.projection import Projection
from edged.talker.text import TextEncoder

CODEC_SPECIALS = ("codec_pad", "codec_bos", "codec_eos", "codec_nothink", "codec_think_bos", "codec_think_eos")
ROLE_SPECIALS = ("im_start", "im_end", "system", "user", "assistant")


class Qwen3Omni(Qwen3TTS):
    name = "qwen3_omni"
    optional_graphs = ()
    layouts = ("segments",)
    codec_specials = CODEC_SPECIALS
    text_specials = TEXT_SPECIALS + ROLE_SPECIALS
    special_keys = CODEC_SPECIALS + TEXT_SPECIALS + ROLE_SPECIALS + MEDIA_TOKENS
    lead_samples = True
    layout_class = SegmentsLayout
    eos_blocked_decisions = 0  # the reference allows eos from the first decision

    def layout(self, artifact) -> SegmentsLayout:
        media = Projection.load(artifact.file("embeddings"), "hidden_projection", artifact.dims.text_hidden,
                                artifact.dims.hidden)
        return SegmentsLayout(artifact, TextEncoder(artifact.file("tokenizer")), media)


FAMILY = Qwen3Omni()
