"""TensorRT 10 backend (Jetson): name-based tensor addresses over mapped pinned host buffers.

On Jetson the CPU and GPU share DRAM, so buffers are pinned host allocations mapped into the
device address space (`cuda.pagelocked_zeros(..., DEVICEMAP)`): the host writes a row, the engine
reads it in place, no copies. A plan is the list of (name, shape, device address) for one
invocation; `run()` sets them on the engine's one execution context, enqueues, and syncs once.

Engines are built on the device from the artifact's ONNX graphs by
`scripts/build_trt_engines.py`, which writes `<graph>.plan` beside each `<graph>.onnx` with one
optimization profile spanning the artifact's limits (batch 1..max_batch, prefill 1..max_seq,
vocoder window 1..window). Validated on a device by `scripts/validate_jetson.sh`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import Backend, Engine, EngineError, Plan, TensorSpec

try:  # optional extra `jetson`; absent everywhere but the device
    import pycuda.driver as cuda
    import tensorrt as trt
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs the `jetson` extra (tensorrt>=10, pycuda)") from exc


class TrtPlan(Plan):
    def __init__(self, engine: TrtEngine, inputs: list[tuple[str, tuple[int, ...]]], addresses: list[tuple[str, int]]):
        self._engine = engine
        self._inputs = inputs
        self._addresses = addresses

    def run(self) -> None:
        ctx = self._engine.context
        for name, shape in self._inputs:
            ctx.set_input_shape(name, shape)
        for name, address in self._addresses:
            ctx.set_tensor_address(name, address)
        if not ctx.execute_async_v3(self._engine.stream.handle):
            raise EngineError(f"{self._engine.name}: execute_async_v3 failed")
        self._engine.stream.synchronize()


class TrtEngine(Engine):
    def __init__(self, path: Path, engine, stream):
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = stream
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = tuple(None if d < 0 else int(d) for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, shape, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(spec)
        super().__init__(path, inputs, outputs)

    def _plan(self, bindings: Mapping[str, np.ndarray]) -> Plan:
        inputs = [(n, tuple(b.shape)) for n, b in bindings.items() if n in self.inputs]
        return TrtPlan(self, inputs, [(n, device_address(b)) for n, b in bindings.items()])


class TrtBackend(Backend):
    name = "tensorrt"

    def __init__(self, device: int = 0):
        cuda.init()
        self.cuda_context = cuda.Device(device).retain_primary_context()
        self.cuda_context.push()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.stream = cuda.Stream()

    def load(self, path: Path) -> Engine:
        plan = Path(path).with_suffix(".plan")
        if not plan.is_file():
            raise EngineError(f"{plan.name}: no TensorRT plan (build it on the device: scripts/build_trt_engines.py)")
        engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
        if engine is None:
            raise EngineError(f"{plan.name}: TensorRT could not deserialize it (built by another TensorRT version?)")
        return TrtEngine(Path(path), engine, self.stream)

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return cuda.pagelocked_zeros(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)


def device_address(buf: np.ndarray) -> int:
    """Device address of a (view of a) mapped pinned buffer: its allocation's base + the byte offset."""
    root = buf
    while isinstance(root.base, np.ndarray):
        root = root.base
    allocation: Any = root.base
    if not hasattr(allocation, "get_device_pointer"):
        raise EngineError("buffer was not allocated by the tensorrt backend (Backend.empty)")
    return int(allocation.get_device_pointer()) + (buf.ctypes.data - root.ctypes.data)
