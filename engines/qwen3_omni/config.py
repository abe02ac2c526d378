"""The Qwen3-Omni checkpoint's config.json, read strictly (engines/config.py), as transformers 4.57
and 5.x write it. Only what the talker, its code predictor and code2wav need is read; the thinker is
not exported.

    im_start/im_end/system/user/assistant_token_id, tts_pad/bos/eos_token_id
    thinker_config                audio/image/video_token_id (media placeholders)
      text_config                 vocab_size (the projected text table's rows)
    talker_config                 num_code_groups, thinker_hidden_size, accept_hidden_layer, the codec
                                  ids (codec_pad_id, codec_bos_id, codec_eos_token_id, codec_nothink_id,
                                  codec_think_bos_id, codec_think_eos_id), speaker_id (table)
      text_config                 the talker stack (engines.config.stack_config, M-RoPE), vocab_size,
                                  num_experts (5.x: num_local_experts), num_experts_per_tok,
                                  moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob
      code_predictor_config       the predictor stack (plain RoPE), vocab_size, num_code_groups
    code2wav_config               the codec (engines.qwen3_omni.codec.codec_config)

Every talker layer is a sparse MoE block in both library versions (the decoder layer replaces the
thinker's block unconditionally), so `decoder_sparse_step` and `mlp_only_layers` mean nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engines.config import ConfigError, MoEConfig, Section, StackConfig, stack_config
from engines.qwen3_omni.codec import codec_config
from engines.qwen3_tts.codec import CodecConfig

CODEC_IDS = {"codec_pad": "codec_pad_id", "codec_bos": "codec_bos_id", "codec_eos": "codec_eos_token_id",
             "codec_nothink": "codec_nothink_id", "codec_think_bos": "codec_think_bos_id",
             "codec_think_eos": "codec_think_eos_id"}
TEXT_IDS = {"tts_pad": "tts_pad_token_id", "tts_bos": "tts_bos_token_id", "tts_eos": "tts_eos_token_id",
            "im_start": "im_start_token_id", "im_end": "im_end_token_id", "system": "system_token_id",
            "user": "user_token_id", "assistant": "assistant_token_id"}
MEDIA_IDS = ("audio_token_id", "image_token_id", "video_token_id")
"""Thinker ids whose rows are hidden states; the library's multimodal_mask reads the thinker's."""


@dataclass(frozen=True)
class Qwen3OmniConfig:
    talker: StackConfig
    moe: MoEConfig
    predictor: StackConfig
    vocab: int
    codebook_size: int
    code_groups: int
    thinker_hidden: int
    text_vocab: int
    accept_hidden_layer: int
    special: dict[str, int]
    speakers: dict[str, int]
    media: dict[str, int]
    codec: CodecConfig

    @classmethod
    def from_checkpoint(cls, checkpoint: Path) -> Qwen3OmniConfig:
        top = Section.read(Path(checkpoint) / "config.json")
        thinker, t = top.section("thinker_config"), top.section("talker_config")
        text, cp = t.section("text_config"), t.section("code_predictor_config")
        groups = t.need("num_code_groups")
        if cp.need("num_code_groups") != groups:
            raise ConfigError(f"{top.file}: {cp.key('num_code_groups')} differs from {t.key('num_code_groups')}")
        if cp.need("hidden_size") != text.need("hidden_size"):  # Qwen3-Omni's predictor has no width projection
            raise ConfigError(f"{top.file}: {cp.key('hidden_size')}={cp.need('hidden_size')} differs from "
                              f"{text.key('hidden_size')}={text.need('hidden_size')} (the code predictor reads the "
                              f"talker's hidden states as they are)")
        return cls(
            talker=stack_config(text, multimodal=True), predictor=stack_config(cp, multimodal=False),
            moe=MoEConfig(experts=text.need("num_experts", alias="num_local_experts"),
                          top_k=text.need("num_experts_per_tok"), expert_width=text.need("moe_intermediate_size"),
                          shared_width=text.need("shared_expert_intermediate_size"),
                          norm_topk_prob=text.need("norm_topk_prob", bool)),
            vocab=text.need("vocab_size"), codebook_size=cp.need("vocab_size"), code_groups=groups,
            thinker_hidden=t.need("thinker_hidden_size"), text_vocab=thinker.section("text_config").need("vocab_size"),
            accept_hidden_layer=t.need("accept_hidden_layer"),
            special={**{k: t.need(v) for k, v in CODEC_IDS.items()}, **{k: top.need(v) for k, v in TEXT_IDS.items()}},
            speakers=t.mapping("speaker_id"),
            media={k: thinker.need(k) for k in MEDIA_IDS},
            codec=codec_config(top.section("code2wav_config")),
        )
