"""The Qwen3-TTS checkpoint's configs, read strictly (engines/config.py): config.json as qwen-tts
0.1.1 writes it through transformers 4.57.3, or re-saved through transformers 5.x; the speech
tokenizer's decoder (`speech_tokenizer/config.json`, `CodecConfig.from_checkpoint`); the generation
defaults (`generation_config.json`).

    config.json
      tts_model_type              custom_voice | voice_design | base
      tts_model_size              "0b6" drops instruct for CustomVoice (null: any other size)
      tts_pad/bos/eos_token_id, im_start/im_end_token_id
      talker_config               the talker stack (engines.config.stack_config, M-RoPE), vocab_size,
                                  num_code_groups, text_hidden_size, text_vocab_size, the codec ids
                                  (codec_pad_id, codec_bos_id, codec_eos_token_id, codec_think_id,
                                  codec_nothink_id, codec_think_bos_id, codec_think_eos_id),
                                  spk_id, spk_is_dialect, codec_language_id (tables; null: none)
        code_predictor_config     the predictor stack (plain RoPE), vocab_size, num_code_groups

Where the two layouts name a value differently, the alias is in engines/config.py (RoPE). The
generation defaults are the checkpoint's generation_config.json where it has them, else the
wrapper's own (`Qwen3TTSModel._merge_generate_kwargs`'s hard_defaults): sampling settings a request
may override, not the model's definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engines.config import ConfigError, Section, StackConfig, stack_config
from engines.qwen3_tts.codec import CodecConfig

KINDS = ("custom_voice", "voice_design", "base")
CODEC_IDS = {"codec_pad": "codec_pad_id", "codec_bos": "codec_bos_id", "codec_eos": "codec_eos_token_id",
             "codec_think": "codec_think_id", "codec_nothink": "codec_nothink_id",
             "codec_think_bos": "codec_think_bos_id", "codec_think_eos": "codec_think_eos_id"}
TEXT_IDS = {"tts_pad": "tts_pad_token_id", "tts_bos": "tts_bos_token_id", "tts_eos": "tts_eos_token_id",
            "im_start": "im_start_token_id", "im_end": "im_end_token_id"}
WRAPPER_SAMPLING = {"temperature": ("temperature", 0.9), "top_k": ("top_k", 50), "top_p": ("top_p", 1.0),
                    "repetition_penalty": ("repetition_penalty", 1.05),
                    "cp_temperature": ("subtalker_temperature", 0.9), "cp_top_k": ("subtalker_top_k", 50),
                    "cp_top_p": ("subtalker_top_p", 1.0)}
"""Manifest sampling key -> (generation_config.json key, the qwen-tts wrapper's hard default)."""


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: StackConfig
    predictor: StackConfig
    vocab: int
    """Talker codec vocabulary (codes + specials)."""
    codebook_size: int
    """Code-predictor vocabulary."""
    code_groups: int
    text_vocab: int
    text_hidden: int
    special: dict[str, int]
    speakers: dict[str, dict]
    languages: dict[str, int]
    model_type: str
    instruct: bool
    """qwen-tts drops instruct for the 0.6B CustomVoice model ("0b6") and never gives one to a Base model."""
    sampling: dict[str, float]
    codec: CodecConfig

    @classmethod
    def from_checkpoint(cls, checkpoint: Path) -> Qwen3TTSConfig:
        checkpoint = Path(checkpoint)
        top = Section.read(checkpoint / "config.json")
        t = top.section("talker_config")
        cp = t.section("code_predictor_config")
        groups = t.need("num_code_groups")
        if cp.need("num_code_groups") != groups:
            raise ConfigError(f"{top.file}: {cp.key('num_code_groups')} differs from {t.key('num_code_groups')}")
        model_type = top.need("tts_model_type", str)
        if model_type not in KINDS:
            raise ConfigError(f"{top.file}: tts_model_type {model_type!r} is not supported ({', '.join(KINDS)})")
        size = top.need("tts_model_size", (str, type(None)))
        speakers = t.mapping("spk_id")
        dialects = t.section("spk_is_dialect", nullable=True)
        languages = t.mapping("codec_language_id")
        return cls(
            talker=stack_config(t, multimodal=True), predictor=stack_config(cp, multimodal=False),
            vocab=t.need("vocab_size"), codebook_size=cp.need("vocab_size"), code_groups=groups,
            text_vocab=t.need("text_vocab_size"), text_hidden=t.need("text_hidden_size"),
            special={**{k: t.need(v) for k, v in CODEC_IDS.items()}, **{k: top.need(v) for k, v in TEXT_IDS.items()}},
            speakers={name: {"id": i, "dialect": _dialect(dialects, name, languages)} for name, i in speakers.items()},
            languages=languages, model_type=model_type,
            # the wrapper's own test, a substring check: `if tts_model_size in "0b6": instruct = None`;
            # and generate_voice_clone (Base) passes none: what one would do to a Base model is unknown
            instruct=model_type != "base" and not (model_type == "custom_voice" and size is not None and size in "0b6"),
            sampling=_sampling(checkpoint / "generation_config.json"),
            codec=CodecConfig.from_checkpoint(checkpoint),
        )


def _dialect(table: Section, speaker: str, languages: dict[str, int]) -> str | None:
    """A speaker's dialect (a language key) or None; the table is keyed as spk_id is."""
    name = next((k for k in table.values if k.lower() == speaker), None)
    if name is None:
        return None
    dialect = table.need(name, (str, bool))
    if dialect is False:
        return None
    if dialect not in languages:
        raise ConfigError(f"{table.file}: {table.key(name)}={dialect!r} is not in codec_language_id")
    return dialect


def _sampling(path: Path) -> dict[str, float]:
    generation = json.loads(path.read_text()) if path.is_file() else {}
    return {key: generation.get(name, default) for key, (name, default) in WRAPPER_SAMPLING.items()}
