"""Fixtures for the toolchain tests: the qwen-tts reference models of the tiny checkpoints, loaded once."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Tests must never reach a model hub; every checkpoint here is a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if importlib.util.find_spec("torch") is not None:
    import torch

    # One thread: the tiny models gain nothing from more, and on small VMs an OpenMP team of 2 can
    # stall ~15 ms per 2-row matmul while its idle thread wakes up (seen with torch 2.13 + MKL).
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_reference(checkpoints: Callable[..., Path]) -> Callable[..., Any]:
    """`tiny_reference(variant=0, seed=0)` -> the qwen-tts `Qwen3TTSModel` for the session's tiny
    checkpoint (`checkpoints` in tests/conftest.py), loaded once."""
    from engines.reference import load_reference

    loaded: dict[tuple[int, int], Any] = {}

    def get(variant: int = 0, seed: int = 0) -> Any:
        key = (variant, seed)
        if key not in loaded:
            loaded[key] = load_reference(checkpoints(variant, seed))
        return loaded[key]

    return get
