"""TensorRT 10 backend (Jetson): name-based tensor addresses, device-resident state, CUDA graphs.

Memory, copies and the K/V append are `cuda_device.py`'s (`CudaDevice`, which this backend is): I/O
the host touches every step in mapped pinned buffers, what only the engines read in device memory.

Activations. Every execution context runs on that one stream, so no two run at once: they share one
block of device memory (`ExecutionContextAllocationStrategy.USER_MANAGED` and `set_device_memory`),
claimed when the first plan is bound and sized by the largest engine's `device_memory_size_v2` (the
most any of its profiles needs, `get_device_memory_size_for_profile_v2`; the Python binding wants at
least that much per context) of every engine loaded by then (an engine loaded later that needs more
is refused: load every engine first). The default, kSTATIC, would give each context its own block
sized for all of its engine's profiles (NvInferRuntime.h, createExecutionContext). A context gets
its device memory, then chooses its profile on the backend's stream, where the switch takes effect
(stream-ordered, and enqueued on the same stream, so nothing needs synchronizing between the two).
NvInferRuntime.h (v10.3.0, setOptimizationProfileAsync, lines 3872-3905) orders the switch only
before the shapes and the enqueue; this is the order of Edge-LLM's LLM runner, which runs the Qwen3
talker and code predictor on one shared block (0.7.1 cpp/runtime/llmEngineRunner.cpp: the memory at
line 419, the profile per step at 1236 and 1560; qwen3OmniTTSRuntime.cpp 122-134 shares the block).
Its multimodal runner chooses the profile first (multimodalRunner.cpp 57-59): either order works.

Contexts. A plan is the list of (name, shape, device address) for one invocation of an engine, on an
execution context set to the optimization profile that admits its shapes (the talker: a context
profile for prefills, a generation profile for decode steps, one engine holding the weights once).
TensorRT 10 lets several live contexts choose the same profile (profile sharing, kPROFILE_SHARING_0806,
on by default since 10.0). A plan captured as a CUDA graph has a context of its own, bound once and
never again: changing shapes on a context changes its internal state, so a graph captured on it
would have to be captured again (TensorRT developer guide, "CUDA Graphs"; one context per captured
graph, NVIDIA/TensorRT#3798). Plans that are enqueued share one context per profile and set their
shapes and addresses there only when another plan of that context ran last. Every setter's result is
checked (TensorRT returns False for a shape outside the profile or an address that is not 256-byte
aligned) and a refusal names the tensor.

Launches. Per-step launch overhead dominates on an Orin, so a plan made for repeated runs (a decode
step, a code-predictor pass, a vocoder window) is captured once, at boot, as a CUDA graph, with its
K/V append inside it, and replayed per run (`cuda_graph.py`); its buffers never move, so the captured
addresses stay right. Before the capture, one ordinary enqueue (TensorRT's first enqueue after
binding may allocate, which a capture cannot hold) and a synchronize (trtexec's sampleInference.cpp
at v10.3 and Edge-LLM both synchronize there). A plan for one run (a prefill of one length), or one
the configuration rarely runs, is enqueued. A capture that fails is ended and cleaned up, logged,
and the plan moves to its profile's shared context and is enqueued there once, retried once if
TensorRT reports the failed capture's error (its statically linked CUDA runtime keeps it until its
next call), then per run; a plan that fails twice fails the boot. `run()` syncs the stream once;
`launches` counts what the host put on it.

The CUDA context is pushed when the backend is made and popped in `close()` (`CudaDevice`), after
every graph, context and engine was released. Plans and kernels are built on the device by
`edged-engines plans`, stamped (`plan_file.py`, `kernels.py`); a stale one is refused at load.
Validated on a device by `scripts/validate_jetson.sh` (its CUDA side alone on any NVIDIA GPU by
`scripts/validate_cuda.py`); in CI, by test doubles of `tensorrt`, `pycuda` and the CUDA driver that
enforce the contracts above (tests/support/fake_trt.py, fake_cuda.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import kernels
from edged.backends.base import Append, Backend, Engine, EngineError, Plan, TensorSpec
from edged.backends.cuda_device import AppendLaunch, CudaDevice, append_table, device_address
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


class Context:
    """One execution context of an engine, on the shared activations, set to one optimization profile."""

    def __init__(self, engine: TrtEngine, index: int):
        backend = engine.backend
        backend.claim(f"{engine.name}: an execution context (profile {index})")  # it holds device memory of its own
        self.index = index
        self.context = engine.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if self.context is None:
            raise EngineError(f"{engine.name}: TensorRT could not create an execution context for profile {index}")
        self.context.set_device_memory(int(backend.activations), engine.activation_bytes)  # then the profile
        try:  # the Python binding raises where C++ returns False
            chosen = self.context.set_optimization_profile_async(index, backend.stream.handle)
        except RuntimeError as exc:
            raise EngineError(f"{engine.name}: TensorRT refused optimization profile {index} ({exc})") from exc
        if not chosen:
            raise EngineError(f"{engine.name}: TensorRT refused optimization profile {index}")
        self.current: TrtPlan | None = None  # the plan whose shapes and addresses are set

    def release(self) -> None:
        self.context = None
        self.current = None


class TrtPlan(Plan):
    def __init__(self, engine: TrtEngine, context: Context, inputs: list[tuple[str, tuple[int, ...]]],
                 addresses: list[tuple[str, int]], append: AppendLaunch | None, label: str):
        self._engine = engine
        self.label = label
        self._context = context
        self._inputs = inputs
        self._addresses = addresses
        self._append = append
        self._graph: Graph | None = None

    def bind(self) -> None:
        """Set this plan's shapes and addresses on its context; every refusal is an error."""
        engine, ctx = self._engine, self._context.context
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
        self._context.current = self

    def enqueue(self) -> None:
        """The engine, then its append, on the stream (captured instead while a capture runs)."""
        if self._context.current is not self:  # another plan of this (shared) context ran last
            self.bind()
        backend = self._engine.backend
        if not self._context.context.execute_async_v3(backend.stream.handle):
            raise EngineError(f"{self._engine.name}: execute_async_v3 failed")
        backend.launches += 1
        if self._append is not None:
            self._append.launch()

    def capture(self) -> None:
        """Warm up and synchronize, then capture the enqueue on this plan's own context; on failure the
        plan is enqueued per run on its profile's shared context."""
        backend = self._engine.backend
        self.enqueue()
        backend.stream.synchronize()
        launches = backend.launches
        try:
            self._graph = Graph(backend.stream.handle, self.enqueue)
        except (CudaError, EngineError, cuda.Error) as exc:
            log.warning("no CUDA graph for %s: %s; it is enqueued per run instead", self.label, exc)
            self._engine.failures.append({"plan": self.label, "why": str(exc)})
            self._context.release()
            self._context = self._engine.context(self._context.index)
            self._enqueue_after_failed_capture()
        else:  # uploaded when instantiated; one replay now, so the first request's step pays nothing more
            self._graph.launch()
            backend.stream.synchronize()
        backend.launches = launches  # neither the capture nor the warm replay is a step's work

    def _enqueue_after_failed_capture(self) -> None:
        """One ordinary enqueue and sync; TensorRT reports (and so clears) the error a failed capture
        left in its own CUDA runtime at its next call, so a refusal is retried once."""
        stream = self._engine.backend.stream
        for attempt in (1, 2):
            try:
                self.enqueue()
                stream.synchronize()
                return
            except (EngineError, cuda.Error) as exc:
                if attempt == 2:
                    raise EngineError(f"{self._engine.name}: a plan whose CUDA graph capture failed cannot be "
                                      f"enqueued either ({exc})") from exc
                log.info("%s: the enqueue after a failed capture reported its error (%s); enqueued again",
                         self._engine.name, exc)

    def run(self) -> None:
        backend = self._engine.backend
        if self._graph is not None:
            self._graph.launch()
            backend.launches += 1
        else:
            self.enqueue()
        backend.stream.synchronize()

    def release(self) -> None:
        """The graph, then this plan's own context (a shared one is the engine's to release)."""
        if self._graph is not None:
            self._graph.close()
            self._graph = None
            self._context.release()


class TrtEngine(Engine):
    def __init__(self, path: Path, engine, backend: TrtBackend):
        self.engine = engine
        self.backend = backend
        self.profiles = list(range(engine.num_optimization_profiles))
        self.shared: dict[int, Context] = {}  # per profile, for the plans that are enqueued
        self.activation_bytes = int(engine.device_memory_size_v2)
        self.captured: list[TrtPlan] = []  # plans a capture was tried for, released in release()
        self.failures: list[dict[str, str]] = []  # {"plan", "why"} of each capture that failed
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = tuple(None if d < 0 else int(d) for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, shape, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(spec)
        super().__init__(path, inputs, outputs)

    def context(self, index: int) -> Context:
        """The context the enqueued plans of profile `index` share (made on first use)."""
        if index not in self.shared:
            self.shared[index] = Context(self, index)
        return self.shared[index]

    def contexts(self) -> list[Context]:
        """Every live context: the shared ones, then each captured plan's own."""
        own = [p._context for p in self.captured if p._graph is not None]
        return [*self.shared.values(), *own]

    def _admits(self, index: int, name: str, shape: tuple[int, ...]) -> bool:
        lo, _, hi = self.engine.get_tensor_profile_shape(name, index)
        return len(lo) == len(shape) and all(a <= d <= b for a, d, b in zip(lo, shape, hi))

    def _profile(self, bindings: Mapping[str, np.ndarray]) -> int:
        """The first optimization profile that admits the bound shapes."""
        dynamic = [(n, tuple(b.shape)) for n, b in bindings.items()
                   if n in self.inputs and None in self.inputs[n].shape]  # static inputs fit every profile
        index = next((i for i in self.profiles if all(self._admits(i, n, s) for n, s in dynamic)), None)
        if index is None:
            shapes = ", ".join(f"{n} {list(s)}" for n, s in dynamic)
            raise EngineError(f"{self.name}: no optimization profile of the plan admits {shapes} ({REBUILD})")
        return index

    def reserve(self, later) -> None:
        """The shared context of each later plan's profile, and every append table, in one block."""
        self.backend.claim_activations()
        tables = []
        for bindings, append in later:
            self.context(self._profile(bindings))
            if append is not None:
                append.check()
                tables.append(append_table(append).view(np.uint8))
        self.backend.reserve_tables(tables)

    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool, append: Append | None, label: str) -> Plan:
        inputs = [(n, tuple(b.shape)) for n, b in bindings.items() if n in self.inputs]
        index = self._profile(bindings)
        self.backend.claim_activations()
        self.backend.marked += repeated
        captured = repeated and self.backend.cuda_graphs
        context = Context(self, index) if captured else self.context(index)
        launch = None if append is None else AppendLaunch(self.backend, append)
        plan = TrtPlan(self, context, inputs, [(n, device_address(b)) for n, b in bindings.items()], launch, label)
        plan.bind()  # refused shapes or addresses fail here, at boot
        if captured:
            self.captured.append(plan)
            plan.capture()
        self.backend.progress()
        return plan

    def graphs(self) -> int:
        return sum(p._graph is not None for p in self.captured)

    def release(self) -> None:
        """Every graph and context, then the engine: none may outlive the CUDA context."""
        for plan in self.captured:
            plan.release()
        self.captured.clear()
        for context in self.shared.values():
            context.release()
        self.shared.clear()
        self.engine = None


class TrtBackend(CudaDevice, Backend):
    name = "tensorrt"

    def __init__(self, device: int = 0, cuda_graphs: bool = True):
        super().__init__(device)
        self.cuda_graphs = cuda_graphs
        self.marked = 0  # plans bound for repeated runs: each gets a CUDA graph where graphs are on
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
        if self.activations is not None and loaded.activation_bytes > self.activation_size:
            raise EngineError(f"{loaded.name}: loaded after plans were bound, it needs {loaded.activation_bytes} "
                              f"bytes of activation memory, {self.activation_size} were claimed: load every "
                              f"engine first")
        self.engines.append(loaded)
        self.progress()
        return loaded

    def claim_activations(self) -> None:
        """One block for every context's activations, the largest any engine needs (once)."""
        if self.activations is None:
            self.claim("the activation block")
            self.activation_size = max((e.activation_bytes for e in self.engines), default=0)
            self.activations = cuda.mem_alloc(max(self.activation_size, 1))

    def activation_bytes(self) -> int:
        return 0 if self.activations is None else self.activation_size

    def graphs(self) -> int:
        """CUDA graphs captured (and held) by the plans bound so far."""
        return sum(e.graphs() for e in self.engines)

    def graph_report(self) -> dict:
        failed = [f for e in self.engines for f in e.failures]
        return {"enabled": self.cuda_graphs, "marked": self.marked, "captured": self.graphs(), "failed": failed}

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
