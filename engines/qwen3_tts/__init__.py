"""Qwen3-TTS (the `qwen-tts` package): talker + residual code predictor (`model`), the 12 Hz
speech-tokenizer decoder (`codec`, `codec_layers`, `codec_export`), the artifact export (`artifact`),
tiny random checkpoints (`tiny`) and the public reference run the way the tests need it
(`reference`). Torch and qwen-tts are imported when a function is called, not here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME = "qwen3_tts"


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
