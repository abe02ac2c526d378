"""Engine backends behind one interface (see `base`)."""

from __future__ import annotations

from edged.backends.base import Append, Backend, Engine, EngineError, Plan, Rows, TensorSpec


def make_backend(name: str = "onnxruntime", threads: int = 0, cuda_graphs: bool = True) -> Backend:
    """The backend called `name`: "onnxruntime" (everywhere) or "tensorrt" (Jetson; `cuda_graphs`:
    replay step plans as CUDA graphs captured at boot)."""
    if name == "onnxruntime":
        from edged.backends.onnxruntime import OrtBackend

        return OrtBackend(threads=threads)
    if name == "tensorrt":
        from edged.backends.tensorrt import TrtBackend

        return TrtBackend(cuda_graphs=cuda_graphs)
    raise ValueError(f"unknown backend {name!r} (known: onnxruntime, tensorrt)")


__all__ = ["Append", "Backend", "Engine", "EngineError", "Plan", "Rows", "TensorSpec", "make_backend"]
