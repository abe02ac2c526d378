"""Engine backends behind one interface (see `base`)."""

from __future__ import annotations

from edged.backends.base import Backend, Engine, EngineError, Plan, TensorSpec


def make_backend(name: str = "onnxruntime", threads: int = 0) -> Backend:
    """The backend called `name`: "onnxruntime" (everywhere) or "tensorrt" (Jetson)."""
    if name == "onnxruntime":
        from edged.backends.onnxruntime import OrtBackend

        return OrtBackend(threads=threads)
    if name == "tensorrt":
        from edged.backends.tensorrt import TrtBackend

        return TrtBackend()
    raise ValueError(f"unknown backend {name!r} (known: onnxruntime, tensorrt)")


__all__ = ["Backend", "Engine", "EngineError", "Plan", "TensorSpec", "make_backend"]
