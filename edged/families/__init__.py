"""Model families, found by name (mlx-lm's `models/<model_type>.py`, vLLM's model registry).

A family is one module here exposing `FAMILY`, a `Family` (see `base`): the manifest checks, host
tables, special ids and prompt layout of one model line. The talker stage, the vocoder stage, the
loop and the daemon ask the artifact's family for these and never name a family themselves.
"""

from __future__ import annotations

import importlib

from edged.artifact.manifest import ArtifactError
from edged.families.base import Family, Talking

KNOWN = ("qwen3_tts", "qwen3_omni")


def get_family(name: str) -> Family:
    if name not in KNOWN:
        raise ArtifactError(f"artifact.json: family {name!r} is not supported (known: {', '.join(KNOWN)})")
    return importlib.import_module(f"edged.families.{name}").FAMILY


__all__ = ["KNOWN", "Family", "Talking", "get_family"]
