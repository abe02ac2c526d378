"""TensorRT 10 backend (Jetson): name-based tensor addresses, device-resident state, CUDA graphs.

Memory. On Jetson the CPU and GPU share DRAM, but pinned host memory is uncached for the GPU: right
for the small I/O the host reads or writes every step (codes, sampling inputs, noise, PCM), which
lives in mapped pinned buffers (`empty`: `cuda.pagelocked_zeros(..., DEVICEMAP)`, read in place, no
copies), and wrong for what only the engines read, the KV cache and the vocoder state, which live in
device memory (`device_empty`: `cuda.mem_alloc`). The host never touches device memory: a new K/V
row is appended, and a state zeroed, by `copy` / `zero`, asynchronous 2-D copies and memsets on the
backend's one stream, ordered with the engines' work.

Engines. A plan is the list of (name, shape, device address) for one invocation of an engine. An
engine has one execution context per optimization profile (the talker: a context profile for
prefills and a generation profile for decode steps, one engine holding the weights once); a plan
runs on the context whose profile admits its shapes, and sets its shapes and addresses there only
when another plan of that context ran last. Every setter's result is checked (TensorRT returns
False for a shape outside the profile or an address that is not 256-byte aligned) and a refusal
names the tensor.

Launches. Per-step launch overhead dominates on an Orin, so a plan made for repeated runs (a decode
step, a code-predictor frame, a vocoder window) is captured once, at boot, as a CUDA graph (after one
warm-up enqueue, as TensorRT requires) and replayed per run (`cuda_graph.py`); its buffers never
move, so the captured addresses stay right. A plan for one run (a prefill of one length) is
enqueued. A capture that fails is reported in the log and that plan is enqueued instead.
`run()` syncs the stream once.

The backend pushes the device's primary CUDA context when it is made and pops (and detaches) it in
`close()`, after freeing graphs, contexts, engines and buffers: a context left on the stack makes
pycuda abort the process at exit. Plans are built on the device by `edged-engines plans`, stamped
with the TensorRT version and the ONNX graph's hash (`plan_file.py`); a stale plan is refused at
load. Validated on a device by `scripts/validate_jetson.sh`; in CI, by test doubles of `tensorrt`,
`pycuda` and the CUDA driver that enforce the contracts above (tests/support/fake_trt.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import Backend, Engine, EngineError, Plan, TensorSpec, copy_rows
from edged.backends.cuda_graph import CudaError, Graph
from edged.backends.plan_file import REBUILD, read_plan

try:  # optional: JetPack's python3-libnvinfer and pycuda built against its CUDA (scripts/install-jetson.sh)
    import pycuda.driver as cuda
    import tensorrt as trt
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs TensorRT's Python bindings and pycuda "
                      "(on JetPack: scripts/install-jetson.sh)") from exc

log = logging.getLogger("edged.tensorrt")


class Profile:
    """One execution context of an engine, set to one optimization profile."""

    def __init__(self, engine, index: int, stream):
        self.index = index
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineError(f"TensorRT could not create an execution context for profile {index}")
        if not self.context.set_optimization_profile_async(index, stream.handle):
            raise EngineError(f"TensorRT refused optimization profile {index}")
        self.current: TrtPlan | None = None

    def admits(self, engine, name: str, shape: tuple[int, ...]) -> bool:
        lo, _, hi = engine.get_tensor_profile_shape(name, self.index)
        return len(lo) == len(shape) and all(a <= d <= b for a, d, b in zip(lo, shape, hi))


class TrtPlan(Plan):
    def __init__(self, engine: TrtEngine, profile: Profile, inputs: list[tuple[str, tuple[int, ...]]],
                 addresses: list[tuple[str, int]]):
        self._engine = engine
        self._profile = profile
        self._inputs = inputs
        self._addresses = addresses
        self._graph: Graph | None = None

    def bind(self) -> None:
        """Set this plan's shapes and addresses on its context; every refusal is an error."""
        engine, ctx = self._engine, self._profile.context
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
        self._profile.current = self

    def enqueue(self) -> None:
        if self._profile.current is not self:  # another plan of this context ran last
            self.bind()
        if not self._profile.context.execute_async_v3(self._engine.stream.handle):
            raise EngineError(f"{self._engine.name}: execute_async_v3 failed")

    def capture(self) -> None:
        """Warm up (TensorRT's first enqueue after binding may allocate), then capture the enqueue."""
        self.enqueue()
        self._engine.stream.synchronize()
        try:
            self._graph = Graph(self._engine.stream.handle, self.enqueue)
        except (CudaError, EngineError) as exc:
            log.warning("%s: no CUDA graph for a plan (%s); it is enqueued per run instead", self._engine.name, exc)

    def run(self) -> None:
        if self._graph is not None:
            self._graph.launch()
        else:
            self.enqueue()
        self._engine.stream.synchronize()

    def release(self) -> None:
        if self._graph is not None:
            self._graph.close()
            self._graph = None


class TrtEngine(Engine):
    def __init__(self, path: Path, engine, stream, cuda_graphs: bool):
        self.engine = engine
        self.stream = stream
        self.cuda_graphs = cuda_graphs
        self.profiles = [Profile(engine, i, stream) for i in range(engine.num_optimization_profiles)]
        self.captured: list[TrtPlan] = []  # plans with a CUDA graph, destroyed in release()
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = tuple(None if d < 0 else int(d) for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, shape, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(spec)
        super().__init__(path, inputs, outputs)

    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool) -> Plan:
        inputs = [(n, tuple(b.shape)) for n, b in bindings.items() if n in self.inputs]
        dynamic = [(n, s) for n, s in inputs if None in self.inputs[n].shape]  # static inputs fit every profile
        profile = next((p for p in self.profiles if all(p.admits(self.engine, n, s) for n, s in dynamic)), None)
        if profile is None:
            shapes = ", ".join(f"{n} {list(s)}" for n, s in dynamic)
            raise EngineError(f"{self.name}: no optimization profile of the plan admits {shapes} ({REBUILD})")
        plan = TrtPlan(self, profile, inputs, [(n, device_address(b)) for n, b in bindings.items()])
        plan.bind()  # refused shapes or addresses fail here, at boot
        if repeated and self.cuda_graphs:
            plan.capture()
            self.captured.append(plan)
        return plan

    def release(self) -> None:
        for plan in self.captured:
            plan.release()
        self.captured.clear()
        self.profiles.clear()
        self.engine = None


class TrtBackend(Backend):
    name = "tensorrt"

    def __init__(self, device: int = 0, cuda_graphs: bool = True):
        cuda.init()
        self.cuda_context = cuda.Device(device).retain_primary_context()
        self.cuda_context.push()
        self.cuda_graphs = cuda_graphs
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.stream = cuda.Stream()
        self.engines: list[TrtEngine] = []
        self.buffers: list[np.ndarray] = []
        self.device_memory: list[Any] = []
        self.closed = False

    def load(self, path: Path) -> Engine:
        onnx_path = Path(path)
        _, serialized = read_plan(onnx_path.with_suffix(".plan"), onnx_path, trt.__version__)
        engine = self.runtime.deserialize_cuda_engine(serialized)
        if engine is None:
            raise EngineError(f"{onnx_path.with_suffix('.plan').name}: TensorRT could not deserialize it ({REBUILD})")
        loaded = TrtEngine(onnx_path, engine, self.stream, self.cuda_graphs)
        self.engines.append(loaded)
        return loaded

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        buf = cuda.pagelocked_zeros(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)  # page-aligned
        self.buffers.append(buf)
        return buf

    def device_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Device memory, zeroed; the array describes it (shape, strides, address) and is never read
        or written by the host: only engines, `copy` and `zero` touch it."""
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        allocation = cuda.mem_alloc(nbytes)  # 256-byte aligned, as cuMemAlloc returns
        self.device_memory.append(allocation)
        cuda.memset_d8(int(allocation), 0, nbytes)
        raw = (ctypes.c_byte * nbytes).from_address(int(allocation))
        return np.frombuffer(raw, dtype=np.uint8)[: nbytes - nbytes % dtype.itemsize].view(dtype).reshape(shape)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[...] = src as one asynchronous 2-D copy on the stream (device or mapped buffers)."""
        width, height, dst_pitch, src_pitch = copy_rows(dst, src)
        c = cuda.Memcpy2D()
        c.set_src_device(device_address(src))
        c.set_dst_device(device_address(dst))
        c.src_pitch, c.dst_pitch, c.width_in_bytes, c.height = src_pitch, dst_pitch, width, height
        c(self.stream)

    def zero(self, dst: np.ndarray) -> None:
        if not dst.flags.c_contiguous:
            raise EngineError("zero() takes a contiguous buffer")
        cuda.memset_d8_async(device_address(dst), 0, dst.nbytes, self.stream)

    def close(self) -> None:
        """Graphs, contexts and engines, then buffers and the stream, then pop and detach the CUDA context."""
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
        for allocation in self.device_memory:
            allocation.free()
        self.device_memory.clear()
        self.stream = None
        cuda.Context.pop()
        self.cuda_context.detach()


def _allocation(buf: np.ndarray) -> tuple[Any, np.ndarray]:
    """What a (view of a) buffer was made on, and the array made on it."""
    root = buf
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base, root


def device_address(buf: np.ndarray) -> int:
    """Device address of a (view of a) buffer: a device array's own address, or a mapped pinned
    buffer's allocation's device pointer + the byte offset."""
    allocation, root = _allocation(buf)
    if isinstance(allocation, ctypes.Array):  # device memory (device_empty): the array's address is the device's
        return buf.ctypes.data
    if not hasattr(allocation, "get_device_pointer"):
        raise EngineError("buffer was not allocated by the tensorrt backend (Backend.empty / device_empty)")
    return int(allocation.get_device_pointer()) + (buf.ctypes.data - root.ctypes.data)
