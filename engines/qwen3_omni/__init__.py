"""Qwen3-Omni (transformers' `qwen3_omni_moe`): its MoE talker and residual code predictor
(`model`, exported with `engines.talker`), its code2wav as the shared streaming codec (`codec`),
tiny random checkpoints made with the library's own classes (`tiny`), the artifact (`artifact`)
and the library's own generation run as the tests compare with it (`reference`). The runtime side
is `edged/families/qwen3_omni.py` and the `segments` layout; docs/dev/qwen3-omni.md says what the
reference does. Torch and transformers are imported when a function is called, not here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.registry import CheckpointFiles

NAME = "qwen3_omni"
CHECKPOINT = CheckpointFiles(
    required=("config.json",),
    optional=("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json",
              "special_tokens_map.json"),
    tensors=("talker.", "code2wav.", "thinker.model.embed_tokens."),
)
"""config.json, the text tokenizer (tokenizer.json, or the slow tokenizer's files it is built from)
and the shards holding the talker (its code predictor and projections), code2wav and the thinker's
text embedding: not the rest of the thinker, which is most of the published checkpoint (`artifact`)."""


def build_tiny(out: Path | str, seed: int, variant: int = 0) -> Path:
    from engines.qwen3_omni.tiny import build_tiny as run

    return run(out, seed, variant)


def build_real_dims(out: Path | str, seed: int, **options: Any) -> Path:
    """options: layers (talker layers, of 20), dtype (fp32 | bf16), shard_size ("2GB")."""
    from engines.qwen3_omni.tiny import build_real_dims as run

    return run(out, seed, **options)


def export(checkpoint: Path | str, out: Path | str, *, max_batch: int = 4, max_seq: int = 1024) -> Any:
    from engines.qwen3_omni.artifact import export as run

    return run(Path(checkpoint), Path(out), max_batch=max_batch, max_seq=max_seq)
