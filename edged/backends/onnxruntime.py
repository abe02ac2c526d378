"""ONNX Runtime backend: CPU everywhere (CUDA EP where present), IO binding onto host buffers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edged.backends.base import Append, Backend, Engine, EngineError, Plan, TensorSpec, aligned_zeros

_DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
           "tensor(float16)": np.float16, "tensor(int32)": np.int32}


class OrtPlan(Plan):
    def __init__(self, session: ort.InferenceSession, binding: ort.IOBinding, append: Append | None):
        self._session = session
        self._binding = binding
        self._append = append

    def run(self) -> None:
        self._session.run_with_iobinding(self._binding)
        if self._append is not None:
            self._append.apply()


class OrtEngine(Engine):
    def __init__(self, path: Path, session: ort.InferenceSession):
        self.session = session
        super().__init__(path, [_spec(path, i) for i in session.get_inputs()],
                         [_spec(path, o) for o in session.get_outputs()])

    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool, append: Append | None, label: str) -> Plan:
        binding = self.session.io_binding()
        for name, buf in bindings.items():
            bind = binding.bind_input if name in self.inputs else binding.bind_output
            bind(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        return OrtPlan(self.session, binding, append)


ACCURACY_LEVEL = "4"
"""MatMulNBits' compute type for quantized weights: 4 = int8 activations (3-4x faster than 0, fp32
activations, on this project's CPUs; docs/dev/performance.md, "8- and 4-bit weights", measures what it costs)."""


class OrtBackend(Backend):
    name = "onnxruntime"

    def __init__(self, threads: int = 0):
        self.threads = threads
        self.engines: list[OrtEngine] = []

    def session_options(self) -> ort.SessionOptions:
        """The options every session of this backend is made with (a benchmark adds its profiling)."""
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        # Spinning worker threads steal the core the other engines and the I/O thread need: on a
        # 2-core machine two spinning threads made the tiny model 4-7x slower.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Block-quantized weights (int8 / int4 artifacts): each DequantizeLinear + MatMul is fused into
        # MatMulNBits; this accuracy level computes it with int8 activations per block.
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", ACCURACY_LEVEL)
        return opts

    def load(self, path: Path) -> Engine:
        try:
            session = ort.InferenceSession(str(path), self.session_options(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for unreadable graphs
            raise EngineError(f"{path.name}: cannot be loaded by ONNX Runtime ({exc})") from exc
        engine = OrtEngine(path, session)
        self.engines.append(engine)
        return engine

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return aligned_zeros(shape, dtype)

    def close(self) -> None:
        """Forget every session; ONNX Runtime frees each with its last reference (its plans')."""
        self.engines.clear()


def _spec(path: Path, node) -> TensorSpec:
    if node.type not in _DTYPES:
        raise EngineError(f"{path.name}: tensor {node.name} has unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int) else None for d in node.shape)
    return TensorSpec(node.name, shape, np.dtype(_DTYPES[node.type]))
