"""TensorRT 10 backend (Jetson): name-based tensor addresses, device-resident state, CUDA graphs.

Memory, copies and the K/V append are `cuda_device.py`'s (`CudaDevice`, which this backend is): I/O
the host touches every step in mapped pinned buffers, what only the engines read in device memory.

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

The CUDA context is pushed when the backend is made and popped in `close()` (`CudaDevice`). Plans
and kernels are built on the device by `edged-engines plans`, stamped (`plan_file.py`,
`kernels.py`); a stale one is refused at load. Validated on a device by `scripts/validate_jetson.sh`
(its CUDA side alone on any NVIDIA GPU by `scripts/validate_cuda.py`); in CI, by test doubles of
`tensorrt`, `pycuda` and the CUDA
driver that enforce the contracts above (tests/support/fake_trt.py, fake_cuda.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import kernels
from edged.backends.base import Append, Backend, Engine, EngineError, Plan, TensorSpec
from edged.backends.cuda_device import AppendLaunch, CudaDevice, device_address
from edged.backends.cuda_graph import CudaError, Graph
from edged.backends.plan_file import REBUILD, open_plan
from edged.backends.tensorrt_version import check as check_version

try:  # optional: JetPack's python3-libnvinfer and pycuda built against its CUDA (scripts/install-jetson.sh)
    import pycuda.driver as cuda
    import tensorrt as trt
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs TensorRT's Python bindings and pycuda "
                      "(on JetPack: scripts/install-jetson.sh)") from exc
check_version(trt.__version__)  # JetPack 6.0's TensorRT 8.6: a named error here, not an AttributeError at boot

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


class TrtBackend(CudaDevice, Backend):
    name = "tensorrt"

    def __init__(self, device: int = 0, cuda_graphs: bool = True):
        super().__init__(device)
        self.cuda_graphs = cuda_graphs
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engines: list[TrtEngine] = []
        self.activations: Any = None
        self.activation_size = 0
        self.closed = False

    def load(self, path: Path) -> Engine:
        onnx_path = Path(path)
        plan_path = onnx_path.with_suffix(".plan")
        self.load_kernels(onnx_path.parent / kernels.FILE)  # the kernels are built with the plans
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

    def close(self) -> None:
        """Graphs, contexts and engines, then the activations, then the buffers, the stream and the
        CUDA context (`CudaDevice.release_cuda`)."""
        if self.closed:
            return
        self.closed = True
        self.stream.synchronize()  # TensorRT: memory bound to tensors must not be released before this
        for engine in reversed(self.engines):
            engine.release()
        self.engines.clear()
        self.runtime = None
        if self.activations is not None:
            self.activations.free()
            self.activations = None
        self.release_cuda()
