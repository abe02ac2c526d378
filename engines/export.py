"""Checkpoint -> engine artifact, for any family the registry knows (the checkpoint names its family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.registry import family_of


def export(checkpoint: Path | str, out: Path | str, *, max_batch: int = 4, max_seq: int = 1024) -> Any:
    """Write the artifact of `checkpoint` into `out`; returns its manifest (`edged.artifact.Manifest`)."""
    return family_of(checkpoint).export(checkpoint, out, max_batch=max_batch, max_seq=max_seq)
