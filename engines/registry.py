"""Model families of the toolchain, found by name (mlx-lm's `_get_classes`, vLLM's model registry).

A family is a package `engines/<family>/` (its model, codec, export, tiny checkpoints and reference
glue) whose `__init__` exposes `export` and `build_tiny` (and `build_real_dims` where the family has
a benchmark checkpoint), and `CHECKPOINT`: the files its export opens, which are all that
engines/hub.py fetches of a checkpoint repository. A checkpoint names its family by the
`model_type` of its config.json.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from engines.config import ConfigError, Section

FAMILIES = ("qwen3_tts", "qwen3_omni")
EXPERT_FAMILIES = ("qwen3_omni",)
"""Families whose talker gathers stacks of experts (engines/experts.py): no Jetson int4 form."""
MODEL_TYPES = {"qwen3_tts": "qwen3_tts", "qwen3_omni_moe": "qwen3_omni"}
"""config.json model_type -> family."""
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
"""A checkpoint's weights: one file, or the shards its index's weight_map names (engines/weights.py)."""


@dataclass(frozen=True)
class CheckpointFiles:
    """What a family's export opens of a checkpoint, as a repository lists its files: the `required`
    files, the `optional` ones (fnmatch patterns: each is opened where the checkpoint has it), and
    the model's weights, `model.safetensors` or, of a sharded checkpoint, its index and the shards
    holding a tensor whose name starts with one of `tensors` (empty: every tensor)."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()

    def reads(self, tensor: str) -> bool:
        return not self.tensors or tensor.startswith(self.tensors)


def family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")
    return importlib.import_module(f"engines.{name}")


def family_of(checkpoint: Path | str) -> ModuleType:
    """The family of a checkpoint directory, from its config.json's model_type."""
    config = Path(checkpoint) / "config.json"
    if not config.is_file():
        raise ConfigError(f"{config}: missing (is {checkpoint} a checkpoint directory?)")
    model_type = Section.read(config).need("model_type", str)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{config}: model_type {model_type!r} is not supported (known: {', '.join(MODEL_TYPES)})")
    return family(MODEL_TYPES[model_type])
