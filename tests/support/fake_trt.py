"""A test double of TensorRT 10.3's Python API, on the CUDA double (fake_cuda.py), that keeps the
contracts edged's TensorRT backend and `edged-engines plans` depend on and refuses what TensorRT
10.3 refuses, each rule citing where TensorRT says so (include/NvInfer.h, NvInferRuntime.h and
python/ at tag v10.3.0; the "Working with Quantized Types" guide; onnx-tensorrt's operator table).

Building (`OnnxParser`, `Builder`):
- the parser refuses an operator outside onnx-tensorrt's support table (docs/operators.md at
  release 10.1-GA; the 10.2 and 10.3 changelogs add no operator), naming it;
- the builder returns None, logging the error, for a dynamic input no profile covers; for a blocked
  DequantizeLinear whose weights are not INT4 (NvInfer.h IDequantizeLayer: "Block dequantization is
  supported only for 2-D input tensors with DataType::kINT4 that are rooted at an IConstantLayer");
  for INT4 blocks other than 64 or 128 rows (Working with Quantized Types); for a precision flag on
  a strongly typed network (NvInfer.h kSTRONGLY_TYPED: "Setting layer precision and layer output
  types is not allowed");
- it warns (TensorRT builds them) about INT4 weights with fp32 scales in a strongly typed network
  ("output data type is inferred from scale data type": an fp32 GEMM), and about fp32 products
  built with TF32 on (BuilderFlag::kTF32 "Enabled by default": their inputs are rounded to 10-bit
  mantissas); the engine keeps `tf32` and `fp32_int4_products`, so a test sees both;
- `build_serialized_network` returns an IHostMemory (a buffer; PLAN_PADDING bytes of engine stand in
  for the weights when a test wants a large plan).

Running (`Runtime`, `ICudaEngine`, `IExecutionContext`):
- `deserialize_cuda_engine` takes any buffer (pyCore.cpp: a py::buffer) and keeps nothing of it;
- `create_execution_context()` (kSTATIC, NvInferRuntime.h) claims device memory of
  `device_memory_size_v2` per context; USER_MANAGED claims none and runs only after
  `set_device_memory(memory, size)`: 256-byte aligned device memory of at least
  `device_memory_size_v2` (pyCoreDoc.h); contexts sharing it may not run in parallel (on two streams
  at once: setDeviceMemoryV2, "undefined behavior"). The sizes are this double's stand-in (4 x the
  inputs' bytes at each profile's largest shapes), not TensorRT's;
- a new context runs profile 0; `set_optimization_profile_async` raises RuntimeError (the Python
  binding's PY_ASSERT_RUNTIME_ERROR) for an index out of range or a profile another live context has
  chosen ("Profile N has been chosen by another IExecutionContext");
- `set_input_shape` returns False for a shape outside the profile or off a static dim;
  `set_tensor_address` returns False for an address that is not 256-byte aligned; `infer_shapes()`
  lists inputs without a shape; `execute_async_v3` returns False unless every input has a shape and
  every tensor an address, a CUDA context is current and the activations are set, and reports (and
  clears) a CUDA runtime error a failed capture left;
- `execute_async_v3` is asynchronous: the ONNX graph the engine was built from runs on ONNX Runtime
  when the stream does, reading and writing the bound buffers through their device addresses, so
  results can be compared with the ONNX Runtime backend's; outputs read before the stream syncs are
  garbage (fake_cuda.py); releasing bound memory first is refused (enqueueV3: "Modifying or
  releasing memory that has been registered for the tensors before stream synchronization ...
  results in undefined behavior");
- under capture, an enqueue is recorded only after an ordinary enqueue with the same bindings
  (trtexec: "Avoid capturing initialization calls by executing the enqueue function at least once
  before starting CUDA graph capture"); an engine in CAPTURE_UNSAFE ("The built TRT engine may
  contain operations that are not permitted under CUDA graph capture mode", sampleInference.cpp)
  invalidates the capture, leaves the runtime error set and returns False.

`install(monkeypatch)` puts `tensorrt`, `pycuda`, `pycuda.driver` and `pycuda.compiler` in
`sys.modules` and the doubles in place of libcuda and libcudart.
"""

from __future__ import annotations

import enum
import json
import struct
import sys
import types
import weakref

import numpy as np
import onnx
import onnxruntime as ort
from support import fake_cuda as cuda

__version__ = "10.3.0.fake"
PLAN_PADDING = 0
"""Bytes of stand-in engine data a built plan carries (a test sets it to make a large plan)."""
CAPTURE_UNSAFE: set[str] = set()
"""ONNX file names whose engines cannot be captured."""
LOGGERS: list[Logger] = []
SUPPORTED = frozenset((
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "BatchNormalization", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DeformConv", "DepthToSpace", "DequantizeLinear", "Div",
    "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "Gather",
    "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "GridSample", "GroupNormalization", "GRU", "HardSigmoid", "HardSwish", "Hardmax", "Identity",
    "If", "ImageScaler", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "LogSoftmax", "Loop", "LRN", "LSTM", "LpNormalization", "LpPool", "MatMul", "Max",
    "MaxPool", "Mean", "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "NonMaxSuppression",
    "NonZero", "Not", "OneHot", "Or", "Pad", "ParametricSoftplus", "Pow", "PRelu", "QuantizeLinear", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "ReverseSequence", "RNN", "RoiAlign", "Round", "ScaledTanh",
    "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
    "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
    "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor",
))
"""onnx-tensorrt docs/operators.md (release 10.1-GA), the operators marked Y."""
INT4_BLOCKS = (64, 128)
MAGIC = b"FAKETRT1"


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


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0
    TACTIC_SHARED_MEMORY = 4
    TACTIC_DRAM = 5


class ExecutionContextAllocationStrategy(enum.IntEnum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


# ----------------------------------------------------------------------------------------- building


class _Tensor:
    def __init__(self, name: str, shape: list[int]) -> None:
        self.name, self.shape = name, shape


class _Network:
    def __init__(self, flags: int = 0) -> None:
        self.strongly_typed = bool(flags & (1 << NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        self.onnx_path: str | None = None
        self.model: onnx.ModelProto | None = None
        self.inputs: list[_Tensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> _Tensor:
        return self.inputs[i]


class _ParserError:
    def __init__(self, node: str, op: str, desc: str) -> None:
        self.node_name, self.op, self._desc = node, op, desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return f"In node {self.node_name} ({self.op}): {self._desc}"


class OnnxParser:
    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> _ParserError:
        return self.errors[i]

    def parse_from_file(self, path: str) -> bool:
        model = onnx.load(path, load_external_data=False)
        self.errors = [_ParserError(n.name, n.op_type, f"No importer registered for op: {n.op_type}")
                       for n in model.graph.node if n.op_type not in SUPPORTED]
        if self.errors:
            return False
        inits = {i.name for i in model.graph.initializer}
        self.network.onnx_path, self.network.model = path, model
        self.network.inputs = [_Tensor(i.name, [d.dim_value if d.HasField("dim_value") else -1
                                                for d in i.type.tensor_type.shape.dim])
                               for i in model.graph.input if i.name not in inits]
        return True


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[list[int], list[int], list[int]]] = {}

    def set_shape(self, name: str, lo, opt, hi) -> None:
        if not (len(lo) == len(opt) == len(hi) and all(a <= b <= c for a, b, c in zip(lo, opt, hi))):
            raise ValueError(f"invalid profile for {name}: {lo} {opt} {hi}")
        self.shapes[name] = (list(lo), list(opt), list(hi))


class _Config:
    def __init__(self) -> None:
        self.flags: set = {BuilderFlag.TF32}  # NvInfer.h BuilderFlag::kTF32: "Enabled by default."
        self.profiles: list[_Profile] = []
        self.pools: dict = {}

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self.flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pools[pool] = size

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class IHostMemory(np.ndarray):
    """The serialized engine: a buffer with `nbytes` (pyFoundationalTypes.cpp: py::buffer_protocol)."""


class Builder:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        return _Network(flags)

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> IHostMemory | None:
        refused = self._refusal(network, config)
        if refused:
            self.logger.log(Logger.ERROR, refused)
            return None
        model = network.model
        assert model is not None
        fp32_int4 = _fp32_scaled_int4(model) if network.strongly_typed else 0
        if fp32_int4:
            self.logger.log(Logger.WARNING, f"{fp32_int4} INT4 weights dequantize to FLOAT (their scales' type in a "
                                            f"strongly typed network): their products run as fp32 GEMMs")
        tf32 = BuilderFlag.TF32 in config.flags
        if tf32 and any(n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") for n in model.graph.node):
            self.logger.log(Logger.WARNING, "TF32 is enabled: fp32 products may round their inputs to 10-bit mantissas")
        spec = json.dumps({"onnx": network.onnx_path, "profiles": [p.shapes for p in config.profiles] or [{}],
                           "strongly_typed": network.strongly_typed, "tf32": tf32,
                           "fp32_int4_products": fp32_int4}).encode()
        data = np.zeros(len(MAGIC) + 8 + len(spec) + PLAN_PADDING, np.uint8)
        data[:len(MAGIC) + 8 + len(spec)] = np.frombuffer(MAGIC + struct.pack("<Q", len(spec)) + spec, np.uint8)
        return data.view(IHostMemory)

    @staticmethod
    def _refusal(network: _Network, config: _Config) -> str | None:
        if network.model is None:
            return "the network has no layers (the parser failed)"
        if network.strongly_typed and config.flags & {BuilderFlag.FP16, BuilderFlag.INT8, BuilderFlag.BF16}:
            return "precision flags are not allowed in a strongly typed network"
        dynamic = [t.name for t in network.inputs if any(d < 0 for d in t.shape)]
        for i, profile in enumerate([p.shapes for p in config.profiles] or [{}]):
            missing = [n for n in dynamic if n not in profile]
            if missing:
                return f"optimization profile {i} has no shapes for dynamic inputs {missing}"
        inits = {i.name: i for i in network.model.graph.initializer}
        for node in network.model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
                continue
            weights, scale = inits[node.input[0]], inits.get(node.input[1])
            blocked = scale is not None and len(scale.dims) == 2
            block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
            if blocked and weights.data_type != onnx.TensorProto.INT4:
                return (f"{node.name}: IDequantizeLayer: block quantization is supported only for 2-D input tensors "
                        f"with DataType::kINT4")
            if weights.data_type == onnx.TensorProto.INT4 and blocked and block not in INT4_BLOCKS:
                return f"{node.name}: INT4 block size {block} is not supported (64 or 128)"
        return None


def _fp32_scaled_int4(model: onnx.ModelProto) -> int:
    inits = {i.name: i for i in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
               and inits[n.input[0]].data_type == onnx.TensorProto.INT4
               and inits[n.input[1]].data_type == onnx.TensorProto.FLOAT)


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
        self.tf32, self.fp32_int4_products = spec["tf32"], spec["fp32_int4_products"]
        self.strongly_typed = spec["strongly_typed"]
        self.io = [(i, TensorIOMode.INPUT) for i in self.session.get_inputs()] + \
                  [(o, TensorIOMode.OUTPUT) for o in self.session.get_outputs()]
        self.chosen: dict[int, weakref.ref] = {}  # profile -> the live context that chose it

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
        """The double's stand-in: 4 x the inputs' bytes at the profile's largest shapes, in 256-byte units."""
        total = 0
        for node, mode in self.io:
            if mode is TensorIOMode.INPUT:
                shape = self.get_tensor_profile_shape(node.name, profile_index)[2]
                total += int(np.prod(shape)) * np.dtype(nptype(ORT_TYPES[node.type])).itemsize
        return -(-4 * total // 256) * 256

    @property
    def device_memory_size_v2(self) -> int:
        return max(self.get_device_memory_size_for_profile_v2(p) for p in range(len(self.profiles)))

    def create_execution_context(self, strategy=ExecutionContextAllocationStrategy.STATIC) -> IExecutionContext:
        return IExecutionContext(self, ExecutionContextAllocationStrategy(int(strategy)))


class IExecutionContext:
    def __init__(self, engine: ICudaEngine, strategy: ExecutionContextAllocationStrategy) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions = 0
        self.profile = 0  # "The newly created execution context will be assigned optimization profile 0."
        self.warm: tuple | None = None  # the bindings of the last ordinary enqueue
        self.own_memory = cuda.mem_alloc(engine.device_memory_size_v2) \
            if strategy is ExecutionContextAllocationStrategy.STATIC else None
        self.memory: int | None = None if self.own_memory is None else int(self.own_memory)
        if self.own_memory is not None:
            weakref.finalize(self, self.own_memory.free)

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        holder = self.engine.chosen.get(profile_index)
        if not 0 <= profile_index < len(self.engine.profiles) or (holder is not None and holder() not in (None, self)):
            raise RuntimeError("Error in set optimization profile async.")  # PY_ASSERT_RUNTIME_ERROR
        self.engine.chosen[profile_index] = weakref.ref(self)
        self.profile = profile_index
        self.shapes.clear()
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
        if cuda.RUNTIME.cudaGetLastError():  # TensorRT reports the error a failed capture left
            return False
        if stream is None or cuda.current() is None or self.memory is None or self.infer_shapes() or \
                len(self.addresses) < len(self.engine.io):
            return False
        bound = (tuple(sorted(self.shapes.items())), tuple(sorted(self.addresses.items())))
        if stream.captured is not None:
            if self.warm != bound:
                return False  # enqueue once, outside capture, before capturing these bindings
            if self.engine.onnx.rsplit("/", 1)[-1] in CAPTURE_UNSAFE:
                stream.invalidated = True
                cuda.RUNTIME.fail(cuda.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
                return False
        else:
            self.warm = bound
        for other in cuda._streams.values():
            if other is not stream and any(w.activations == self.memory for w in other.pending):
                raise cuda.LogicError("activation memory shared by contexts running in parallel")
        shapes, addresses = dict(self.shapes), dict(self.addresses)
        outputs = [node for node, mode in self.engine.io if mode is TensorIOMode.OUTPUT]

        def run() -> None:
            feeds = {}
            for node, mode in self.engine.io:
                if mode is TensorIOMode.INPUT:
                    dtype = np.dtype(nptype(ORT_TYPES[node.type]))
                    feeds[node.name] = cuda.device_view(addresses[node.name], shapes[node.name], dtype).copy()
            for node, value in zip(outputs, self.engine.session.run(None, feeds)):
                cuda.device_view(addresses[node.name], value.shape, value.dtype)[...] = value
            self.executions += 1

        writes = [_rest_of_allocation(addresses[node.name]) for node in outputs]  # output sizes are TensorRT's to know
        work = cuda.Work(run, writes, "enqueueV3", touches=[(a, 1) for a in addresses.values()] + [(self.memory, 1)])
        work.activations = self.memory
        stream.enqueue(work)
        return True


def _rest_of_allocation(address: int) -> tuple[int, int]:
    region = cuda.region_of(address)
    return address, region.address + region.size - address


# ----------------------------------------------------------------------------------------- install


def install(monkeypatch) -> types.SimpleNamespace:
    """Make `import tensorrt` and `import pycuda.driver` give these doubles (and reload the backend)."""
    this = sys.modules[__name__]
    trt = types.ModuleType("tensorrt")
    for name in ("__version__", "DataType", "nptype", "TensorIOMode", "Logger", "NetworkDefinitionCreationFlag",
                 "BuilderFlag", "MemoryPoolType", "ExecutionContextAllocationStrategy", "OnnxParser", "Builder",
                 "Runtime", "ICudaEngine", "IExecutionContext", "IHostMemory"):
        setattr(trt, name, getattr(this, name))
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
    monkeypatch.setattr(cuda_graph, "driver", lambda: libcuda)
    monkeypatch.setattr(cuda_graph, "runtime", lambda: cuda.RUNTIME)
    CAPTURE_UNSAFE.clear()
    return types.SimpleNamespace(trt=trt, driver=driver, libcuda=libcuda, runtime=cuda.RUNTIME)


stack_depth = cuda.stack_depth
