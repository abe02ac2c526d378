"""Shared fixtures: tiny random checkpoints built with the reference classes, and their artifacts.

Building and exporting take seconds each, so both are cached for the whole test session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PARITY_VARIANTS = (0, 1, 2)  # three different shapes (see engines/tiny.py VARIANTS)


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def checkpoints(build_dir):
    """checkpoints(variant, seed=0) -> a tiny checkpoint directory (built once)."""
    from engines.tiny import build_tiny

    cache: dict[tuple[int, int], Path] = {}

    def get(variant: int, seed: int = 0) -> Path:
        key = (variant, seed)
        if key not in cache:
            cache[key] = build_tiny(build_dir / f"ckpt-v{variant}-s{seed}", seed, variant)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def artifacts(build_dir, checkpoints):
    """artifacts(variant, seed=0) -> an exported artifact directory (exported once)."""
    from engines.export import export

    cache: dict[tuple[int, int], Path] = {}

    def get(variant: int, seed: int = 0) -> Path:
        key = (variant, seed)
        if key not in cache:
            out = build_dir / f"art-v{variant}-s{seed}"
            export(checkpoints(variant, seed), out, max_batch=4, max_seq=256)
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session")
def builtin_artifact() -> Path:
    """The built-in tiny artifact (or EDGED_TEST_ARTIFACT, for device validation)."""
    from edged.artifact import BUILTIN

    return Path(os.environ.get("EDGED_TEST_ARTIFACT", BUILTIN))


@pytest.fixture(scope="session")
def backend():
    """The backend under test: onnxruntime here, tensorrt on a device (EDGED_TEST_BACKEND)."""
    from edged.backends import make_backend

    return make_backend(os.environ.get("EDGED_TEST_BACKEND", "onnxruntime"), threads=1)
