"""TensorRT 10 backend (Jetson): name-based tensor addresses, device-resident state, CUDA graphs.

Memory. On Jetson the CPU and GPU share DRAM, but pinned host memory is uncached for the GPU: right
for the small I/O the host reads or writes every step (codes, sampling inputs, noise, PCM), which
lives in mapped pinned buffers (`empty`: `cuda.pagelocked_zeros(..., DEVICEMAP)`, read in place, no
copies), and wrong for what only the engines read, the KV cache, the vocoder state and the code
predictor's heads, which live in device memory (`device_empty`, `device_from`: `cuda.mem_alloc`).
The host never touches device memory: K/V rows are appended by a kernel (`kernels.py`), state is
copied and zeroed by `copy` / `zero`, on the backend's one stream, ordered with the engines' work.

Activations. Every execution context runs on that one stream, so no two run at once: they share one
block of device memory (`ExecutionContextAllocationStrategy.USER_MANAGED` and `set_device_memory`),
claimed when the first plan is bound and sized by the largest engine's `device_memory_size_v2` (the
most any of its profiles needs, `get_device_memory_size_for_profile_v2`; the Python binding wants at
least that much per context) of every engine loaded by then (an engine loaded later that needs more
is refused: load every engine first). The default, kSTATIC, would give each context its own block
sized for all of its engine's profiles (NvInferRuntime.h, createExecutionContext).

Engines. A plan is the list of (name, shape, device address) for one invocation of an engine. An
engine has one execution context per optimization profile (the talker: a context profile for
prefills and a generation profile for decode steps, one engine holding the weights once); a plan
runs on the context whose profile admits its shapes, and sets its shapes and addresses there only
when another plan of that context ran last. Every setter's result is checked (TensorRT returns
False for a shape outside the profile or an address that is not 256-byte aligned) and a refusal
names the tensor.

Launches. Per-step launch overhead dominates on an Orin, so a plan made for repeated runs (a decode
step, a code-predictor pass, a vocoder window) is captured once, at boot, as a CUDA graph, with its
K/V append inside it (after one ordinary enqueue, as TensorRT requires), and replayed per run
(`cuda_graph.py`); its buffers never move, so the captured addresses stay right. A plan for one run
(a prefill of one length), or one the configuration rarely runs, is enqueued. A capture that fails
is ended and cleaned up, logged, and that plan is enqueued instead. `run()` syncs the stream once;
`launches` counts what the host put on it.

The backend pushes the device's primary CUDA context when it is made and pops (and detaches) it in
`close()`, after freeing graphs, contexts, engines and buffers: a context left on the stack makes
pycuda abort the process at exit. Plans and kernels are built on the device by `edged-engines
plans`, stamped (`plan_file.py`, `kernels.py`); a stale one is refused at load. Validated on a
device by `scripts/validate_jetson.sh`; in CI, by test doubles of `tensorrt`, `pycuda` and the CUDA
driver that enforce the contracts above (tests/support/fake_trt.py, fake_cuda.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import kernels
from edged.backends.base import Append, Backend, Engine, EngineError, Plan, TensorSpec, block, copy_rows
from edged.backends.cuda_graph import CudaError, Graph
from edged.backends.plan_file import REBUILD, open_plan

try:  # optional: JetPack's python3-libnvinfer and pycuda built against its CUDA (scripts/install-jetson.sh)
    import pycuda.driver as cuda
    import tensorrt as trt
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs TensorRT's Python bindings and pycuda "
                      "(on JetPack: scripts/install-jetson.sh)") from exc

log = logging.getLogger("edged.tensorrt")


class Profile:
    """One execution context of an engine, set to one optimization profile, on the shared activations."""

    def __init__(self, engine, index: int, stream):
        self.index = index
        self.context = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if self.context is None:
            raise EngineError(f"TensorRT could not create an execution context for profile {index}")
        try:  # the Python binding raises where C++ returns False
            chosen = self.context.set_optimization_profile_async(index, stream.handle)
        except RuntimeError as exc:
            raise EngineError(f"TensorRT refused optimization profile {index} ({exc})") from exc
        if not chosen:
            raise EngineError(f"TensorRT refused optimization profile {index}")
        self.current: TrtPlan | None = None

    def admits(self, engine, name: str, shape: tuple[int, ...]) -> bool:
        lo, _, hi = engine.get_tensor_profile_shape(name, self.index)
        return len(lo) == len(shape) and all(a <= d <= b for a, d, b in zip(lo, shape, hi))


class AppendLaunch:
    """One `append_rows` launch: the table of every (cache, rows) pair in device memory, made at boot."""

    def __init__(self, backend: TrtBackend, append: Append):
        table = np.zeros(len(append.rows), kernels.ROWS)
        for i, r in enumerate(append.rows):
            width, runs, cache_pitch, rows_pitch = copy_rows(block(r.cache[0], r.axis - 1, r.rows.shape[r.axis]),
                                                             r.rows[0])
            table[i] = (device_address(r.cache), device_address(r.rows), r.cache.strides[0], r.rows.strides[0],
                        cache_pitch, rows_pitch, r.cache.strides[r.axis], runs, width)
        self.table = backend.device_table(table.view(np.uint8))
        n = append.rows[0].rows.shape[0]
        self.grid = (kernels.grid(int((table["runs"] * table["width"]).max())), len(table), n)
        self.args = (device_address(self.table), device_address(append.positions),
                     0 if append.slots is None else device_address(append.slots),
                     0 if append.active is None else device_address(append.active))
        self.backend = backend

    def launch(self) -> None:
        b = self.backend
        assert b.kernels is not None  # loaded with the first engine
        b.kernels.append_rows.prepared_async_call(self.grid, (kernels.THREADS, 1, 1), b.stream, *self.args)
        b.launches += 1


class TrtPlan(Plan):
    def __init__(self, engine: TrtEngine, profile: Profile, inputs: list[tuple[str, tuple[int, ...]]],
                 addresses: list[tuple[str, int]], append: AppendLaunch | None):
        self._engine = engine
        self._profile = profile
        self._inputs = inputs
        self._addresses = addresses
        self._append = append
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
        """The engine, then its append, on the stream (captured instead while a capture runs)."""
        if self._profile.current is not self:  # another plan of this context ran last
            self.bind()
        backend = self._engine.backend
        if not self._profile.context.execute_async_v3(backend.stream.handle):
            raise EngineError(f"{self._engine.name}: execute_async_v3 failed")
        backend.launches += 1
        if self._append is not None:
            self._append.launch()

    def capture(self) -> None:
        """Warm up (TensorRT's first enqueue after binding may allocate, which a capture cannot hold),
        then capture the enqueue; on failure the plan is enqueued per run."""
        backend = self._engine.backend
        self.enqueue()
        launches = backend.launches
        try:
            self._graph = Graph(backend.stream.handle, self.enqueue)
        except (CudaError, EngineError, cuda.Error) as exc:
            log.warning("%s: no CUDA graph for a plan (%s); it is enqueued per run instead", self._engine.name, exc)
        backend.launches = launches  # what a capture records is not launched

    def run(self) -> None:
        backend = self._engine.backend
        if self._graph is not None:
            self._graph.launch()
            backend.launches += 1
        else:
            self.enqueue()
        backend.stream.synchronize()

    def release(self) -> None:
        if self._graph is not None:
            self._graph.close()
            self._graph = None


class TrtEngine(Engine):
    def __init__(self, path: Path, engine, backend: TrtBackend):
        self.engine = engine
        self.backend = backend
        self.profiles = [Profile(engine, i, backend.stream) for i in range(engine.num_optimization_profiles)]
        self.activation_bytes = int(engine.device_memory_size_v2)
        self.captured: list[TrtPlan] = []  # plans with a CUDA graph, destroyed in release()
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = tuple(None if d < 0 else int(d) for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, shape, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(spec)
        super().__init__(path, inputs, outputs)

    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool, append: Append | None) -> Plan:
        inputs = [(n, tuple(b.shape)) for n, b in bindings.items() if n in self.inputs]
        dynamic = [(n, s) for n, s in inputs if None in self.inputs[n].shape]  # static inputs fit every profile
        profile = next((p for p in self.profiles if all(p.admits(self.engine, n, s) for n, s in dynamic)), None)
        if profile is None:
            shapes = ", ".join(f"{n} {list(s)}" for n, s in dynamic)
            raise EngineError(f"{self.name}: no optimization profile of the plan admits {shapes} ({REBUILD})")
        self.backend.claim_activations()
        launch = None if append is None else AppendLaunch(self.backend, append)
        plan = TrtPlan(self, profile, inputs, [(n, device_address(b)) for n, b in bindings.items()], launch)
        plan.bind()  # refused shapes or addresses fail here, at boot
        if repeated and self.backend.cuda_graphs:
            plan.capture()
            self.captured.append(plan)
        return plan

    def graphs(self) -> int:
        return sum(p._graph is not None for p in self.captured)

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
        self.device = cuda.Device(device)
        self.cuda_context = self.device.retain_primary_context()
        self.cuda_context.push()
        self.cuda_graphs = cuda_graphs
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.stream = cuda.Stream()
        self.engines: list[TrtEngine] = []
        self.buffers: list[np.ndarray] = []
        self.device_memory: list[Any] = []
        self.activations: Any = None
        self.activation_size = 0
        self.tables: dict[bytes, np.ndarray] = {}  # append tables by content: a plan bound again reuses its own
        self.kernels: Kernels | None = None
        self.launches = 0
        self.closed = False

    def load(self, path: Path) -> Engine:
        onnx_path = Path(path)
        plan_path = onnx_path.with_suffix(".plan")
        if self.kernels is None:  # the kernels are built with the plans
            self.kernels = Kernels(onnx_path.parent / kernels.FILE, self.device)
        with open_plan(plan_path, onnx_path, trt.__version__) as (_, serialized):
            engine = self.runtime.deserialize_cuda_engine(serialized)  # from the mapping: no host copy
        if engine is None:
            raise EngineError(f"{plan_path.name}: TensorRT could not deserialize it ({REBUILD})")
        loaded = TrtEngine(onnx_path, engine, self)
        self.engines.append(loaded)
        if self.activations is not None:  # plans are bound already: its contexts must fit the block
            self._use_activations(loaded)
        return loaded

    def claim_activations(self) -> None:
        """One block for every context's activations, the largest any engine needs (once)."""
        if self.activations is None:
            self.activation_size = max((e.activation_bytes for e in self.engines), default=0)
            self.activations = cuda.mem_alloc(max(self.activation_size, 1))
            for engine in self.engines:
                self._use_activations(engine)

    def _use_activations(self, engine: TrtEngine) -> None:
        if engine.activation_bytes > self.activation_size:
            raise EngineError(f"{engine.name}: loaded after plans were bound, it needs {engine.activation_bytes} bytes "
                              f"of activation memory, {self.activation_size} were claimed: load every engine first")
        for p in engine.profiles:
            p.context.set_device_memory(int(self.activations), engine.activation_bytes)

    def activation_bytes(self) -> int:
        return 0 if self.activations is None else self.activation_size

    def graphs(self) -> int:
        """CUDA graphs captured (and held) by the plans bound so far."""
        return sum(e.graphs() for e in self.engines)

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        buf = cuda.pagelocked_zeros(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)  # page-aligned
        self.buffers.append(buf)
        return buf

    def device_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Device memory, zeroed; the array describes it (shape, strides, address) and is never read
        or written by the host: only engines, kernels, `copy` and `zero` touch it."""
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        allocation = cuda.mem_alloc(nbytes)  # 256-byte aligned, as cuMemAlloc returns
        self.device_memory.append(allocation)
        cuda.memset_d8(int(allocation), 0, nbytes)
        raw = (ctypes.c_byte * nbytes).from_address(int(allocation))
        array = np.frombuffer(raw, dtype=np.uint8)[: nbytes - nbytes % dtype.itemsize].view(dtype).reshape(shape)
        return array.view(DeviceArray)

    def device_from(self, array: np.ndarray) -> np.ndarray:
        buf = self.device_empty(array.shape, array.dtype)
        cuda.memcpy_htod(device_address(buf), np.ascontiguousarray(array))  # synchronous: boot only
        return buf

    def device_table(self, table: np.ndarray) -> np.ndarray:
        """`table` in device memory, once per distinct content: a prefill plan dropped and bound
        again for the same length finds its table, so admissions never grow the device memory."""
        key = table.tobytes()
        if key not in self.tables:
            self.tables[key] = self.device_from(table)
        return self.tables[key]

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[...] = src on the stream: one contiguous copy, or the 2-D copy kernel (any pitches)."""
        width, height, dst_pitch, src_pitch = copy_rows(dst, src)
        if height == 1 or (width == dst_pitch == src_pitch):
            cuda.memcpy_dtod_async(device_address(dst), device_address(src), width * height, self.stream)
        else:
            if self.kernels is None:
                raise EngineError("a 2-D copy needs the kernels, which come with the plans: load an engine first")
            self.kernels.copy_rows.prepared_async_call(
                (kernels.grid(width * height), 1), (kernels.THREADS, 1, 1), self.stream, device_address(dst),
                device_address(src), dst_pitch, src_pitch, width, height)
        self.launches += 1

    def zero(self, dst: np.ndarray) -> None:
        if not dst.flags.c_contiguous:
            raise EngineError("zero() takes a contiguous buffer")
        cuda.memset_d8_async(device_address(dst), 0, dst.nbytes, self.stream)
        self.launches += 1

    def sync(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        """Graphs, contexts and engines, then buffers and the stream, then pop and detach the CUDA context."""
        if self.closed:
            return
        self.closed = True
        self.stream.synchronize()  # TensorRT: memory bound to tensors must not be released before this
        for engine in reversed(self.engines):
            engine.release()
        self.engines.clear()
        self.runtime = None
        self.kernels = None
        for buf in self.buffers:
            _allocation(buf)[0].free()
        self.buffers.clear()
        for allocation in self.device_memory:
            allocation.free()
        self.device_memory.clear()
        if self.activations is not None:
            self.activations.free()
            self.activations = None
        self.stream = None
        cuda.Context.pop()
        self.cuda_context.detach()


class DeviceArray(np.ndarray):
    """An array describing device memory: its repr (a log line, a traceback) never reads it."""

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, address={self.ctypes.data:#x})"

    __str__ = __repr__


class Kernels:
    """The kernels of `kernels.py`, loaded from the cubin `edged-engines plans` built for this GPU."""

    def __init__(self, path: Path, device):
        major, minor = device.compute_capability()
        module = cuda.module_from_buffer(kernels.read(path, f"sm_{major}{minor}"))
        self.module = module
        self.append_rows = module.get_function("append_rows").prepare("PPPP")
        self.copy_rows = module.get_function("copy_rows").prepare("PPqqqq")


def _allocation(buf: np.ndarray) -> tuple[Any, np.ndarray]:
    """What a (view of a) buffer was made on, and the array made on it."""
    root = buf
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base, root


def device_address(buf: np.ndarray) -> int:
    """Device address of a (view of a) buffer: a mapped pinned buffer's allocation's device pointer +
    the byte offset, or a device array's own address."""
    allocation, root = _allocation(buf)
    if hasattr(allocation, "get_device_pointer"):
        return int(allocation.get_device_pointer()) + (buf.ctypes.data - root.ctypes.data)
    if isinstance(allocation, ctypes.Array):  # device memory (device_empty): the array's address is the device's
        return buf.ctypes.data
    raise EngineError("buffer was not allocated by the tensorrt backend (Backend.empty / device_empty)")
