"""A test double of TensorRT 10.3's Python API, on the CUDA double (fake_cuda.py), that keeps the
contracts edged's TensorRT backend and `edged-engines plans` depend on and refuses what TensorRT
10.3 refuses, each rule citing where TensorRT says so (include/NvInfer.h, NvInferRuntime.h and
python/ at tag v10.3.0; the "Working with Quantized Types" guide; onnx-tensorrt's operator table).

Running (`Runtime`, `ICudaEngine`, `IExecutionContext`):
- `deserialize_cuda_engine` takes any buffer (pyCore.cpp: a py::buffer) and keeps nothing of it;
- every execution context claims CONTEXT_BYTES of persistent device memory of its own when it is
  created, whatever its allocation strategy, and frees it when destroyed (the developer guide, quoted
  in NVIDIA/TensorRT#3907: "Persistent memory required by some layer implementations ... This memory
  is allocated on creation of the execution context, and lasts for its lifetime"; not part of
  `device_memory_size_v2`); public verbose logs show 28 KB to 8.3 MiB per context, the double charges
  1 MiB;
- `create_execution_context()` (kSTATIC, NvInferRuntime.h) claims device memory of
  `device_memory_size_v2` per context; USER_MANAGED claims none and runs only after
  `set_device_memory(memory, size)`: 256-byte aligned device memory of at least
  `device_memory_size_v2` (pyCoreDoc.h); contexts sharing it may not run in parallel (on two streams
  at once: setDeviceMemoryV2, "undefined behavior"). The sizes are what the builder recorded
  (fake_trt_build.py's stand-in), not TensorRT's;
- a new context runs profile 0; `set_optimization_profile_async` raises RuntimeError (the Python
  binding's PY_ASSERT_RUNTIME_ERROR) for an index out of range. It is accepted before or after
  `set_device_memory`: NvInferRuntime.h (v10.3.0, lines 3872-3905) orders it only before
  `setInputShape` and the enqueue, and NVIDIA's own runners use both orders (TensorRT-Edge-LLM 0.7.1
  cpp/runtime/llmEngineRunner.cpp: memory at line 419, the profile per step at 1236 and 1560;
  cpp/multimodal/multimodalRunner.cpp: the profile at init, lines 57-59, the memory later). The
  header says the switch "may require that data is copied via cudaMemcpyAsync" and not where to; it
  is not modelled as a write into the activation block, which Edge-LLM shares between the talker's
  and the code predictor's contexts while each switches profiles (qwen3OmniTTSRuntime.cpp 122-134).
  Several live contexts may choose the same profile: profile sharing
  (PreviewFeature kPROFILE_SHARING_0806) is on by default since TensorRT 10.0 (trtexec's
  sampleOptions.cpp in 10.x: "profileSharing0806 is on by default in TensorRT 10.0. This flag is
  deprecated and has no effect"); "each optimization profile can only have one execution context" is
  TensorRT 8's rule, without that feature. The switch is stream-ordered: the host's calls see the new
  profile at once, the device's work once the stream has reached the switch; an enqueue on another
  stream before that stream synchronized is refused ("It is the application's responsibility to
  guarantee that synchronization between the profile sync stream and the enqueue stream occurs");
- `set_input_shape` returns False for a shape outside the profile or off a static dim;
  `set_tensor_address` returns False for an address that is not 256-byte aligned; `infer_shapes()`
  lists inputs without a shape; `execute_async_v3` returns False unless every input has a shape and
  every tensor an address, a CUDA context is current and the activations are set, and reports (and
  clears) the error a failed capture left in TensorRT's own CUDA runtime (`RUNTIME`: libnvinfer links
  cudart statically, so the process's libcudart, fake_cuda.RUNTIME, holds another last error, and
  clearing that one leaves TensorRT's set);
- `execute_async_v3` is asynchronous: the ONNX graph the engine was built from runs on ONNX Runtime
  when the stream does, reading and writing the bound buffers through their device addresses, so
  results can be compared with the ONNX Runtime backend's; outputs read before the stream syncs are
  garbage (fake_cuda.py); releasing bound memory first is refused (enqueueV3: "Modifying or
  releasing memory that has been registered for the tensors before stream synchronization ...
  results in undefined behavior");
- under capture, an enqueue is recorded only after an ordinary enqueue with the same profile,
  memory, shapes and addresses has completed (trtexec: "Avoid capturing initialization calls by
  executing the enqueue function at least once before starting CUDA graph capture", and it
  synchronizes the stream before capturing, sampleInference.cpp at v10.3, as Edge-LLM does); an
  engine in CAPTURE_UNSAFE ("The built TRT engine may contain operations that are not permitted under
  CUDA graph capture mode", sampleInference.cpp) invalidates the capture, leaves TensorRT's runtime
  error set and returns False;
- a replayed graph runs on the context as it is at the replay: if its profile, memory, shapes or
  addresses changed since the capture, its outputs are garbage (0xFF bytes), as the device's would
  silently be (TensorRT developer guide, "CUDA Graphs": changing shapes on a context changes its
  internal state, so a graph captured on it must be captured again; one context per captured graph,
  NVIDIA/TensorRT#3798). Setting the same values again is no change;
- every engine and context is in `LIVE` until it is destroyed, so a test can check that none
  outlives the CUDA context it was made in (their destructors free CUDA memory).

`install(monkeypatch)` puts `tensorrt`, `pycuda`, `pycuda.driver` and `pycuda.compiler` in
`sys.modules` and the doubles in place of libcuda and the process's libcudart, with fresh last-error
stores for it and for TensorRT.
"""

from __future__ import annotations

import enum
import json
import struct
import sys
import types
import weakref

import numpy as np
import onnxruntime as ort
from support import fake_cuda as cuda

__version__ = "10.3.0.fake"
CAPTURE_UNSAFE: set[str] = set()
"""ONNX file names whose engines cannot be captured."""
LOGGERS: list[Logger] = []
MAGIC = b"FAKETRT1"
RUNTIME = cuda.CudaRuntime()
"""TensorRT's own CUDA runtime: libnvinfer links cudart statically, so its last error is not the one
the process's libcudart (fake_cuda.RUNTIME) holds or clears."""
CONTEXT_BYTES = 1 << 20
"""Persistent device memory each execution context holds for its lifetime (see above)."""
LIVE: weakref.WeakSet = weakref.WeakSet()
"""Every engine and execution context not yet destroyed (a test checks none outlives the CUDA context)."""


class DataType(enum.Enum):
    FLOAT = "float32"
    HALF = "float16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"
    UINT8 = "uint8"


ORT_TYPES = {"tensor(float)": DataType.FLOAT, "tensor(float16)": DataType.HALF, "tensor(int32)": DataType.INT32,
             "tensor(int64)": DataType.INT64, "tensor(bool)": DataType.BOOL, "tensor(uint8)": DataType.UINT8}


def nptype(dtype: DataType) -> type:
    return np.dtype(dtype.value).type


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = 0, 1, 2, 3, 4

    def __init__(self, level: int = 2) -> None:
        self.level = level
        self.messages: list[tuple[int, str]] = []
        LOGGERS.append(self)

    def log(self, severity: int, message: str) -> None:
        if severity <= self.level:
            self.messages.append((severity, message))


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


class BuilderFlag(enum.Enum):
    FP16 = 0
    INT8 = 1
    TF32 = 6
    BF16 = 17


class ProfilingVerbosity(enum.Enum):
    LAYER_NAMES_ONLY = 0  # NvInferRuntime.h: the default
    NONE = 1
    DETAILED = 2  # "Print detailed layer information including layer names and layer parameters."


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0
    TACTIC_SHARED_MEMORY = 4
    TACTIC_DRAM = 5


class ExecutionContextAllocationStrategy(enum.IntEnum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


# ----------------------------------------------------------------------------------------- running


class Runtime:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine) -> ICudaEngine | None:
        with memoryview(serialized_engine) as view:  # any buffer; nothing of it is kept
            head = bytes(view[:len(MAGIC) + 8])
            if len(head) < len(MAGIC) + 8 or head[:len(MAGIC)] != MAGIC:
                self.logger.log(Logger.ERROR, "the serialized engine is not a TensorRT engine")
                return None
            (length,) = struct.unpack("<Q", head[len(MAGIC):])
            spec = json.loads(bytes(view[len(MAGIC) + 8:len(MAGIC) + 8 + length]))
        return ICudaEngine(spec)


class ICudaEngine:
    def __init__(self, spec: dict) -> None:
        self.onnx = spec["onnx"]
        self.session = ort.InferenceSession(spec["onnx"], providers=["CPUExecutionProvider"])
        self.profiles = spec["profiles"]
        self.activation_bytes = spec["activation_bytes"]
        self.tf32, self.fp32_int4_products = spec["tf32"], spec["fp32_int4_products"]
        self.strongly_typed = spec["strongly_typed"]
        self.aux_streams = spec["aux_streams"]
        self.profiling_verbosity = ProfilingVerbosity[spec["profiling_verbosity"]]
        self.io = [(i, TensorIOMode.INPUT) for i in self.session.get_inputs()] + \
                  [(o, TensorIOMode.OUTPUT) for o in self.session.get_outputs()]
        LIVE.add(self)

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, i: int) -> str:
        return self.io[i][0].name

    def _node(self, name: str):
        return next((node, mode) for node, mode in self.io if node.name == name)

    def get_tensor_shape(self, name: str) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in self._node(name)[0].shape]

    def get_tensor_dtype(self, name: str) -> DataType:
        return ORT_TYPES[self._node(name)[0].type]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self._node(name)[1]

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[list[int]]:
        node, mode = self._node(name)
        if mode is not TensorIOMode.INPUT or not 0 <= profile_index < len(self.profiles):
            raise RuntimeError(f"get_tensor_profile_shape: no input {name} in profile {profile_index}")
        if name in self.profiles[profile_index]:
            return [list(x) for x in self.profiles[profile_index][name]]
        return [self.get_tensor_shape(name)] * 3

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        """What the builder recorded for the profile (fake_trt_build.py)."""
        return int(self.activation_bytes[profile_index])

    @property
    def device_memory_size_v2(self) -> int:
        return max(self.get_device_memory_size_for_profile_v2(p) for p in range(len(self.profiles)))

    def create_engine_inspector(self) -> EngineInspector:
        return EngineInspector(self)

    def create_execution_context(self, strategy=ExecutionContextAllocationStrategy.STATIC) -> IExecutionContext:
        return IExecutionContext(self, ExecutionContextAllocationStrategy(int(strategy)))


class LayerInformationFormat(enum.Enum):
    ONELINE = 0
    JSON = 1


DATATYPES = {1: "Float", 10: "Half", 22: "Int4", 3: "Int8", 7: "Int64", 6: "Int32", 9: "Bool"}
"""ONNX TensorProto types as the inspector names them (trt-engine-explorer reads "Int4", "Half", ...)."""


class EngineInspector:
    """`create_engine_inspector()`: with a DETAILED plan, one layer per ONNX node, as built (no layer is
    fused: a DequantizeLinear of INT4 weights stays a layer of its own, which is what an engine that did
    not fuse it would show); a LAYER_NAMES_ONLY plan lists names only (NvInferRuntime.h, kDETAILED:
    "layer names and layer parameters")."""

    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine

    def get_engine_information(self, fmt: LayerInformationFormat) -> str:
        import onnx

        model = onnx.load(self.engine.onnx, load_external_data=False)
        if self.engine.profiling_verbosity is not ProfilingVerbosity.DETAILED:
            return json.dumps({"Layers": [n.name for n in model.graph.node]})
        inits = {i.name: DATATYPES.get(i.data_type, "Float") for i in model.graph.initializer}
        layers = [{"Name": n.name, "LayerType": n.op_type,
                   "Inputs": [{"Name": x, "Format/Datatype": f"Row major linear {inits.get(x, 'Float')} format"}
                              for x in n.input if x],
                   "Outputs": [{"Name": y, "Format/Datatype": "Row major linear Float format"} for y in n.output]}
                  for n in model.graph.node]
        return json.dumps({"Layers": layers})


class IExecutionContext:
    def __init__(self, engine: ICudaEngine, strategy: ExecutionContextAllocationStrategy) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions = 0
        self.profile = 0  # "The newly created execution context will be assigned optimization profile 0."
        self.device_profile = 0  # the profile the context's work runs with, once the stream reached the switch
        self.warmed: tuple | None = None  # the state of the last ordinary enqueue that completed
        LIVE.add(self)
        self.persistent = cuda.mem_alloc(CONTEXT_BYTES)  # the context's own, whatever the strategy
        weakref.finalize(self, self.persistent.free)
        self.own_memory = cuda.mem_alloc(engine.device_memory_size_v2) \
            if strategy is ExecutionContextAllocationStrategy.STATIC else None
        self.memory: int | None = None if self.own_memory is None else int(self.own_memory)
        if self.own_memory is not None:
            weakref.finalize(self, self.own_memory.free)

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        stream = cuda.stream_of(stream_handle)
        if not 0 <= profile_index < len(self.engine.profiles) or stream is None:
            raise RuntimeError("Error in set optimization profile async.")  # PY_ASSERT_RUNTIME_ERROR
        self.profile = profile_index
        self.shapes.clear()

        def switch() -> None:  # takes effect for the device's work in stream order
            self.device_profile = profile_index
        work = cuda.Work(switch, [], "setOptimizationProfileAsync")
        work.switch_of = self
        stream.enqueue(work)
        return True

    def set_device_memory(self, memory: int, size: int) -> None:
        try:
            device = cuda.region_of(int(memory), max(size, 1)).device
        except cuda.LogicError:
            device = False
        if not device or int(memory) % 256 or size < self.engine.device_memory_size_v2:
            raise RuntimeError(f"set_device_memory: need 256-byte aligned device memory of at least "
                               f"{self.engine.device_memory_size_v2} bytes")
        self.memory = int(memory)

    def set_input_shape(self, name: str, shape) -> bool:
        node, mode = self.engine._node(name)
        static = self.engine.get_tensor_shape(name)
        if mode is not TensorIOMode.INPUT or len(shape) != len(static):
            return False
        if any(s >= 0 and s != d for s, d in zip(static, shape)):
            return False
        profile = self.engine.profiles[self.profile]
        if name in profile:
            lo, _, hi = profile[name]
            if any(not a <= d <= c for a, d, c in zip(lo, shape, hi)):
                return False
        self.shapes[name] = tuple(int(d) for d in shape)
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        if address % 256:
            return False
        self.engine._node(name)
        self.addresses[name] = int(address)
        return True

    def infer_shapes(self) -> list[str]:
        return [node.name for node, mode in self.engine.io if mode is TensorIOMode.INPUT and node.name not in self.shapes]

    def execute_async_v3(self, stream_handle: int) -> bool:
        stream = cuda.stream_of(stream_handle)
        if RUNTIME.cudaGetLastError():  # TensorRT reports (and so clears) the error its own runtime holds
            return False
        if stream is None or cuda.current() is None or self.memory is None or self.infer_shapes() or \
                len(self.addresses) < len(self.engine.io):
            return False
        bound = self._state()
        captured = stream.captured is not None
        if captured:
            if self.warmed != bound:
                return False  # an ordinary enqueue of these bindings first, completed (the stream synchronized)
            if self.engine.onnx.rsplit("/", 1)[-1] in CAPTURE_UNSAFE:
                stream.invalidated = True
                RUNTIME.fail(cuda.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
                return False
        for other in cuda._streams.values():
            if other is not stream and any(w.activations == self.memory for w in other.pending):
                raise cuda.LogicError("activation memory shared by contexts running in parallel")
            if other is not stream and any(getattr(w, "switch_of", None) is self for w in other.pending):
                # NvInferRuntime.h setOptimizationProfileAsync: "It is the application's responsibility to
                # guarantee that synchronization between the profile sync stream and the enqueue stream occurs."
                raise cuda.LogicError("enqueueV3 on a stream not synchronized with this context's profile switch")
        shapes, addresses, profile = dict(self.shapes), dict(self.addresses), self.profile
        outputs = [node for node, mode in self.engine.io if mode is TensorIOMode.OUTPUT]

        def run() -> None:
            # a replayed graph runs on what the context is now: another profile on the device, or other
            # shapes, addresses or memory set since the capture, and its outputs are garbage
            garbage = self.device_profile != profile or (captured and self._state() != bound)
            feeds = {}
            for node, mode in self.engine.io:
                if mode is TensorIOMode.INPUT:
                    dtype = np.dtype(nptype(ORT_TYPES[node.type]))
                    feeds[node.name] = cuda.device_view(addresses[node.name], shapes[node.name], dtype).copy()
            for node, value in zip(outputs, self.engine.session.run(None, feeds)):
                out = cuda.device_view(addresses[node.name], value.shape, value.dtype)
                if garbage:
                    out.view(np.uint8)[...] = cuda.POISON
                else:
                    out[...] = value
            self.executions += 1
            if not captured:
                self.warmed = bound

        writes = [_rest_of_allocation(addresses[node.name]) for node in outputs]  # output sizes are TensorRT's to know
        work = cuda.Work(run, writes, "enqueueV3", touches=[(a, 1) for a in addresses.values()] + [(self.memory, 1)])
        work.activations = self.memory
        stream.enqueue(work)
        return True

    def _state(self) -> tuple:
        """What an enqueue runs with: the profile, the activations, every shape and address."""
        return self.profile, self.memory, tuple(sorted(self.shapes.items())), tuple(sorted(self.addresses.items()))


def _rest_of_allocation(address: int) -> tuple[int, int]:
    region = cuda.region_of(address)
    return address, region.address + region.size - address


# ----------------------------------------------------------------------------------------- install


def install(monkeypatch) -> types.SimpleNamespace:
    """Make `import tensorrt` and `import pycuda.driver` give these doubles (and reload the backend)."""
    from support import fake_trt_build as build

    this = sys.modules[__name__]
    trt = types.ModuleType("tensorrt")
    for name in ("__version__", "DataType", "nptype", "TensorIOMode", "Logger", "NetworkDefinitionCreationFlag",
                 "BuilderFlag", "MemoryPoolType", "ProfilingVerbosity", "ExecutionContextAllocationStrategy", "Runtime",
                 "ICudaEngine", "IExecutionContext", "LayerInformationFormat"):
        setattr(trt, name, getattr(this, name))
    for name in ("OnnxParser", "Builder", "IHostMemory"):
        setattr(trt, name, getattr(build, name))
    driver = types.ModuleType("pycuda.driver")
    for name in ("init", "Device", "Context", "Stream", "Error", "LogicError", "pagelocked_zeros", "host_alloc_flags",
                 "mem_alloc", "mem_alloc_pitch", "mem_get_info", "memset_d8", "memset_d8_async", "memcpy_htod",
                 "memcpy_dtod_async", "Memcpy2D", "module_from_buffer"):
        setattr(driver, name, getattr(cuda, name))
    compiler = types.ModuleType("pycuda.compiler")
    compiler.compile = cuda.compile  # type: ignore[attr-defined]
    pycuda = types.ModuleType("pycuda")
    pycuda.driver, pycuda.compiler = driver, compiler  # type: ignore[attr-defined]
    for name, module in (("tensorrt", trt), ("pycuda", pycuda), ("pycuda.driver", driver),
                         ("pycuda.compiler", compiler)):
        monkeypatch.setitem(sys.modules, name, module)
    for module in ("edged.backends.tensorrt", "edged.backends.cuda_device"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    from edged.backends import cuda_graph

    libcuda = cuda.Driver()
    cuda.RUNTIME = cuda.CudaRuntime()
    monkeypatch.setattr(this, "RUNTIME", cuda.CudaRuntime())
    monkeypatch.setattr(cuda_graph, "driver", lambda: libcuda)
    monkeypatch.setattr(cuda_graph, "runtime", lambda: cuda.RUNTIME)
    CAPTURE_UNSAFE.clear()
    return types.SimpleNamespace(trt=trt, driver=driver, libcuda=libcuda, runtime=cuda.RUNTIME, trt_runtime=RUNTIME)


stack_depth = cuda.stack_depth
