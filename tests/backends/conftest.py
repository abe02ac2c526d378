"""The TensorRT backend over the doubles of TensorRT, pycuda and the CUDA driver (tests/support/fake_trt.py)."""

from __future__ import annotations

import pytest
from support import fake_trt


@pytest.fixture
def trt(monkeypatch):
    """edged.backends.tensorrt, imported over the doubles; no CUDA context may be left pushed."""
    fake_trt.install(monkeypatch)
    from edged.backends import tensorrt

    yield tensorrt
    assert fake_trt.stack_depth() == 0, "a CUDA context was left pushed: pycuda aborts at exit"
