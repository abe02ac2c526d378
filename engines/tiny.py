"""Tiny random-weight checkpoints of any family, built with the family's public reference classes."""

from __future__ import annotations

from pathlib import Path

from engines.registry import family


def build_tiny(out: Path | str, seed: int, variant: int = 0, *, family_name: str = "qwen3_tts",
               kind: str | None = None) -> Path:
    """A tiny checkpoint of `family_name`, shape variant `variant`; deterministic from `seed`.
    `kind`: the family's checkpoint kind (qwen3_tts: custom_voice or base); None = its default."""
    if kind is None:
        return family(family_name).build_tiny(out, seed, variant)
    return family(family_name).build_tiny(out, seed, variant, kind=kind)


def build_real_dims(out: Path | str, seed: int, *, family_name: str = "qwen3_tts", kind: str | None = None,
                    **options) -> Path:
    """A random checkpoint with the family's real dimensions (the smallest released unless `options`
    say otherwise: the family's build_real_dims), for benchmarks."""
    if kind is not None:
        options["kind"] = kind
    return family(family_name).build_real_dims(out, seed, **options)
