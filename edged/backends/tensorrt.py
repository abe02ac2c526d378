"""TensorRT 10 backend (Jetson): name-based tensor addresses over mapped pinned host buffers.

On Jetson the CPU and GPU share DRAM, so buffers are pinned host allocations mapped into the
device address space (`cuda.pagelocked_zeros(..., DEVICEMAP)`): the host writes a row, the engine
reads it in place, no copies. A plan is the list of (name, shape, device address) for one
invocation of an engine; each engine has one execution context, and a plan sets its shapes and
addresses on it only when another plan of that engine ran last. Every setter's result is checked
(TensorRT returns False for a shape outside the profile or an address that is not 256-byte
aligned) and a refusal names the tensor. `run()` enqueues and syncs once.

The backend pushes the device's primary CUDA context when it is made and pops (and detaches) it in
`close()`, after freeing contexts, engines and buffers: a context left on the stack makes pycuda
abort the process at exit. Plans are built on the device by `edged-engines plans`, stamped with
the TensorRT version and the ONNX graph's hash (`plan_file.py`); a stale plan is refused at load.
Validated on a device by `scripts/validate_jetson.sh`; in CI, by test doubles of `tensorrt` and
`pycuda` that enforce the contracts above (tests/support/fake_trt.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import Backend, Engine, EngineError, Plan, TensorSpec
from edged.backends.plan_file import REBUILD, read_plan

try:  # optional: JetPack's python3-libnvinfer and pycuda built against its CUDA (scripts/install-jetson.sh)
    import pycuda.driver as cuda
    import tensorrt as trt
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs TensorRT's Python bindings and pycuda "
                      "(on JetPack: scripts/install-jetson.sh)") from exc


class TrtPlan(Plan):
    def __init__(self, engine: TrtEngine, inputs: list[tuple[str, tuple[int, ...]]], addresses: list[tuple[str, int]]):
        self._engine = engine
        self._inputs = inputs
        self._addresses = addresses

    def bind(self) -> None:
        """Set this plan's shapes and addresses on the engine's context; every refusal is an error."""
        engine, ctx = self._engine, self._engine.context
        for name, shape in self._inputs:
            if not ctx.set_input_shape(name, shape):
                raise EngineError(f"{engine.name}: TensorRT refused shape {list(shape)} for {name} "
                                  f"(outside the plan's optimization profile; {REBUILD})")
        for name, address in self._addresses:
            if not ctx.set_tensor_address(name, address):
                raise EngineError(f"{engine.name}: TensorRT refused address {address:#x} for {name} "
                                  f"(tensor addresses must be 256-byte aligned)")
        unresolved = ctx.infer_shapes()
        if unresolved:
            raise EngineError(f"{engine.name}: shapes not resolved for {sorted(unresolved)}")
        engine.current = self

    def run(self) -> None:
        engine = self._engine
        if engine.current is not self:  # another plan of this engine ran last
            self.bind()
        if not engine.context.execute_async_v3(engine.stream.handle):
            raise EngineError(f"{engine.name}: execute_async_v3 failed")
        engine.stream.synchronize()


class TrtEngine(Engine):
    def __init__(self, path: Path, engine, stream):
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = stream
        self.current: TrtPlan | None = None
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
        plan = TrtPlan(self, inputs, [(n, device_address(b)) for n, b in bindings.items()])
        plan.bind()  # refused shapes or addresses fail here, at boot
        return plan

    def release(self) -> None:
        self.current = None
        self.context = None
        self.engine = None


class TrtBackend(Backend):
    name = "tensorrt"

    def __init__(self, device: int = 0):
        cuda.init()
        self.cuda_context = cuda.Device(device).retain_primary_context()
        self.cuda_context.push()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.stream = cuda.Stream()
        self.engines: list[TrtEngine] = []
        self.buffers: list[np.ndarray] = []
        self.closed = False

    def load(self, path: Path) -> Engine:
        onnx_path = Path(path)
        _, serialized = read_plan(onnx_path.with_suffix(".plan"), onnx_path, trt.__version__)
        engine = self.runtime.deserialize_cuda_engine(serialized)
        if engine is None:
            raise EngineError(f"{onnx_path.with_suffix('.plan').name}: TensorRT could not deserialize it ({REBUILD})")
        loaded = TrtEngine(onnx_path, engine, self.stream)
        self.engines.append(loaded)
        return loaded

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        buf = cuda.pagelocked_zeros(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)  # page-aligned
        self.buffers.append(buf)
        return buf

    def close(self) -> None:
        """Contexts and engines, then buffers and the stream, then pop and detach the CUDA context."""
        if self.closed:
            return
        self.closed = True
        self.stream.synchronize()
        for engine in reversed(self.engines):
            engine.release()
        self.engines.clear()
        self.runtime = None
        for buf in self.buffers:
            _allocation(buf)[0].free()
        self.buffers.clear()
        self.stream = None
        cuda.Context.pop()
        self.cuda_context.detach()


def _allocation(buf: np.ndarray) -> tuple[Any, np.ndarray]:
    """The page-locked allocation under a (view of a) buffer, and the array made on it."""
    root = buf
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base, root


def device_address(buf: np.ndarray) -> int:
    """Device address of a (view of a) mapped pinned buffer: its allocation's base + the byte offset."""
    allocation, root = _allocation(buf)
    if not hasattr(allocation, "get_device_pointer"):
        raise EngineError("buffer was not allocated by the tensorrt backend (Backend.empty)")
    return int(allocation.get_device_pointer()) + (buf.ctypes.data - root.ctypes.data)
