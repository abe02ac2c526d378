"""Test doubles of `tensorrt` (10.x) and `pycuda.driver` that keep the real APIs' documented
contracts, so the TensorRT backend's own code runs in CI without a GPU.

What they enforce, as the real libraries do:
- `set_input_shape` returns False for a shape outside the optimization profile (or off a static
  dim); `set_tensor_address` returns False for an address that is not 256-byte aligned;
  `infer_shapes()` lists inputs without a shape; `execute_async_v3` fails (False) unless every
  input has a shape and every tensor an address, and only while the CUDA context is current.
- pycuda: contexts are a per-thread stack; a backend that pushes must pop before it goes
  (`stack_depth()` lets a test check the balance that pycuda checks at exit); page-locked buffers
  are page-aligned and have a device pointer distinct from their host address.
- A deserialized engine runs the ONNX graph it was built from on ONNX Runtime (CPU), reading and
  writing the bound buffers through their device addresses, so results can be compared with the
  ONNX Runtime backend's.

`install(monkeypatch)` puts them in `sys.modules` as `tensorrt`, `pycuda` and `pycuda.driver`.
"""

from __future__ import annotations

import enum
import json
import sys
import threading
import types

import numpy as np
import onnxruntime as ort

__version__ = "10.3.0.fake"
DEVICE_OFFSET = 1 << 44
"""Device pointer = host address + this (mapped memory has its own device address)."""
_local = threading.local()
_allocations: list[tuple[int, int, np.ndarray]] = []
"""(device start, device end, host bytes) of every live page-locked allocation."""


# ----------------------------------------------------------------------------------------- pycuda


def stack_depth() -> int:
    return len(getattr(_local, "stack", []))


class Context:
    def __init__(self) -> None:
        self.detached = False

    def push(self) -> None:
        _local.stack = [*getattr(_local, "stack", []), self]

    @staticmethod
    def pop() -> None:
        stack = getattr(_local, "stack", [])
        if not stack:
            raise RuntimeError("cuCtxPopCurrent failed: no current context")
        _local.stack = stack[:-1]

    def detach(self) -> None:
        if self.detached:
            raise RuntimeError("context already detached")
        self.detached = True


def current() -> Context | None:
    stack = getattr(_local, "stack", [])
    return stack[-1] if stack else None


class Device:
    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def retain_primary_context(self) -> Context:
        return Context()


class Stream:
    def __init__(self) -> None:
        self.handle = id(self)

    def synchronize(self) -> None:
        pass


class HostAllocation(bytearray):
    """A page-locked, device-mapped allocation: the buffer a numpy array is built on."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes + 4096)
        start = np.frombuffer(self, dtype=np.uint8).ctypes.data
        self.offset = -start % 4096  # page-aligned, as cuMemHostAlloc returns
        self.nbytes = nbytes
        self.host = start + self.offset
        self.freed = False
        _allocations.append((self.host + DEVICE_OFFSET, self.host + DEVICE_OFFSET + nbytes,
                             np.frombuffer(self, dtype=np.uint8, count=nbytes, offset=self.offset)))

    def get_device_pointer(self) -> int:
        if self.freed:
            raise RuntimeError("use of a freed page-locked allocation")
        return self.host + DEVICE_OFFSET

    def free(self) -> None:
        self.freed = True
        _allocations[:] = [a for a in _allocations if a[0] != self.host + DEVICE_OFFSET]


class host_alloc_flags:
    DEVICEMAP = 2


def pagelocked_zeros(shape, dtype, mem_flags: int = 0) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    allocation = HostAllocation(max(nbytes, 1))
    return np.ndarray(shape, dtype, buffer=allocation, offset=allocation.offset)  # .base: the allocation


def init() -> None:
    pass


def device_view(address: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The host memory behind `nbytes` at a device address (it must lie in one live allocation)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    for start, end, host in _allocations:
        if start <= address and address + nbytes <= end:
            return host[address - start: address - start + nbytes].view(dtype).reshape(shape)
    raise RuntimeError(f"illegal memory access: {nbytes} bytes at {address:#x} are not in any allocation")


# ----------------------------------------------------------------------------------------- tensorrt


class DataType(enum.Enum):
    FLOAT = "float32"
    HALF = "float16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"


ORT_TYPES = {"tensor(float)": DataType.FLOAT, "tensor(float16)": DataType.HALF, "tensor(int32)": DataType.INT32,
             "tensor(int64)": DataType.INT64, "tensor(bool)": DataType.BOOL}


def nptype(dtype: DataType) -> type:
    return np.dtype(dtype.value).type


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class Logger:
    WARNING = 2

    def __init__(self, level: int = 2) -> None:
        self.level = level


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


class BuilderFlag(enum.Enum):
    FP16 = "fp16"
    TF32 = "tf32"


class MemoryPoolType(enum.Enum):
    WORKSPACE = "workspace"
    TACTIC_SHARED_MEMORY = "tactic_shared_memory"


class _Tensor:
    def __init__(self, name: str, shape: list[int]) -> None:
        self.name, self.shape = name, shape


class _Network:
    def __init__(self) -> None:
        self.onnx_path: str | None = None
        self.inputs: list[_Tensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> _Tensor:
        return self.inputs[i]


class OnnxParser:
    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.num_errors = 0

    def parse_from_file(self, path: str) -> bool:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.network.onnx_path = path
        self.network.inputs = [_Tensor(i.name, [d if isinstance(d, int) else -1 for d in i.shape])
                               for i in session.get_inputs()]
        return True

    def get_error(self, i: int) -> str:
        return ""


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[list[int], list[int], list[int]]] = {}

    def set_shape(self, name: str, lo, opt, hi) -> None:
        if not (len(lo) == len(opt) == len(hi) and all(a <= b <= c for a, b, c in zip(lo, opt, hi))):
            raise ValueError(f"invalid profile for {name}: {lo} {opt} {hi}")
        self.shapes[name] = (list(lo), list(opt), list(hi))


class _Config:
    def __init__(self) -> None:
        self.flags: set = set()
        self.profiles: list[_Profile] = []
        self.pools: dict = {}

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self.flags.discard(flag)

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pools[pool] = size

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class Builder:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        return _Network()

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        dynamic = [t.name for t in network.inputs if any(d < 0 for d in t.shape)]
        profile = config.profiles[0].shapes if config.profiles else {}
        missing = [n for n in dynamic if n not in profile]
        if missing:
            raise RuntimeError(f"no optimization profile for dynamic inputs {missing}")
        return json.dumps({"onnx": network.onnx_path, "profile": profile}).encode()


class ICudaEngine:
    def __init__(self, spec: dict) -> None:
        self.session = ort.InferenceSession(spec["onnx"], providers=["CPUExecutionProvider"])
        self.profile = spec["profile"]
        self.io = [(i, TensorIOMode.INPUT) for i in self.session.get_inputs()] + \
                  [(o, TensorIOMode.OUTPUT) for o in self.session.get_outputs()]

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

    def create_execution_context(self) -> IExecutionContext:
        return IExecutionContext(self)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions = 0

    def set_input_shape(self, name: str, shape) -> bool:
        node, mode = self.engine._node(name)
        static = self.engine.get_tensor_shape(name)
        if mode is not TensorIOMode.INPUT or len(shape) != len(static):
            return False
        if any(s >= 0 and s != d for s, d in zip(static, shape)):
            return False
        if name in self.engine.profile:
            lo, _, hi = self.engine.profile[name]
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
        if current() is None or self.infer_shapes() or len(self.addresses) < len(self.engine.io):
            return False
        feeds = {}
        for node, mode in self.engine.io:
            if mode is TensorIOMode.INPUT:
                dtype = np.dtype(nptype(ORT_TYPES[node.type]))
                feeds[node.name] = device_view(self.addresses[node.name], self.shapes[node.name], dtype).copy()
        outputs = self.engine.session.run(None, feeds)
        for (node, _), value in zip([io for io in self.engine.io if io[1] is TensorIOMode.OUTPUT], outputs):
            device_view(self.addresses[node.name], value.shape, value.dtype)[...] = value
        self.executions += 1
        return True


class Runtime:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
        try:
            return ICudaEngine(json.loads(data))
        except (ValueError, KeyError):
            return None


# ----------------------------------------------------------------------------------------- install


def install(monkeypatch) -> types.SimpleNamespace:
    """Make `import tensorrt` and `import pycuda.driver` give these doubles (and reload the backend)."""
    this = sys.modules[__name__]
    trt = types.ModuleType("tensorrt")
    for name in ("__version__", "DataType", "nptype", "TensorIOMode", "Logger", "NetworkDefinitionCreationFlag",
                 "BuilderFlag", "MemoryPoolType", "OnnxParser", "Builder", "Runtime", "ICudaEngine",
                 "IExecutionContext"):
        setattr(trt, name, getattr(this, name))
    driver = types.ModuleType("pycuda.driver")
    for name in ("init", "Device", "Context", "Stream", "pagelocked_zeros", "host_alloc_flags"):
        setattr(driver, name, getattr(this, name))
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.delitem(sys.modules, "edged.backends.tensorrt", raising=False)
    return types.SimpleNamespace(trt=trt, driver=driver)
