"""The clone encoder's graphs: what an artifact needs to clone voices (no imports beyond this)."""

from __future__ import annotations

from collections.abc import Container

ROLES = ("speaker_encoder", "codec_encoder")


def can_clone(graphs: Container[str]) -> bool:
    """Whether an artifact with these graphs has a clone encoder (Base exports and the built-in one)."""
    return all(role in graphs for role in ROLES)
