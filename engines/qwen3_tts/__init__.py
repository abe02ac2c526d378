"""Qwen3-TTS (the `qwen-tts` package): talker + residual code predictor (`model`), the 12 Hz
speech-tokenizer decoder (`codec`, `codec_layers`, `codec_export`), the artifact export (`artifact`),
tiny random checkpoints (`tiny`) and the public reference run the way the tests need it
(`reference`). Torch and qwen-tts are imported when a function is called, not here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.registry import CheckpointFiles

NAME = "qwen3_tts"
CHECKPOINT = CheckpointFiles(
    required=("config.json", "speech_tokenizer/config.json"),
    optional=("generation_config.json", "preprocessor_config.json", "processor_config.json", "tokenizer.json",
              "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json",
              "chat_template.json", "chat_template.jinja", "speech_tokenizer/*"),
)
"""The configs (`config`), the text tokenizer as qwen-tts's processor loads it (`artifact`), the speech
tokenizer (its decoder is the vocoder; a Base export loads it whole for the clone encoder) and every
weight tensor (the talker and code predictor; a Base checkpoint's speaker encoder)."""


def export(checkpoint: Path | str, out: Path | str, *, max_batch: int = 4, max_seq: int = 1024) -> Any:
    from engines.qwen3_tts.artifact import export as run

    return run(Path(checkpoint), Path(out), max_batch=max_batch, max_seq=max_seq)


def build_tiny(out: Path | str, seed: int, variant: int = 0, kind: str = "custom_voice") -> Path:
    from engines.qwen3_tts.tiny import build_tiny as run

    return run(out, seed, variant, kind)


def build_real_dims(out: Path | str, seed: int, kind: str = "custom_voice", **options: Any) -> Path:
    """options: size (0.6b | 1.7b), dtype (fp32 | bf16), shard_size ("1GB")."""
    from engines.qwen3_tts.tiny import build_real_dims as run

    return run(out, seed, kind, **options)
