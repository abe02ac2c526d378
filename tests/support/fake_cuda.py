"""A test double of CUDA as edged's TensorRT backend reaches it: `pycuda.driver` (and
`pycuda.compiler`), libcuda's graph calls (through ctypes, `edged.backends.cuda_graph`) and
libcudart's last error. It keeps the documented contracts the backend depends on, and breaks the
way the real part breaks where the backend could get them wrong:

- Contexts are a per-thread stack (pycuda `Context.push/pop`); one left pushed makes pycuda abort at
  exit, so `stack_depth()` lets a test check the balance.
- Streams are asynchronous (CUDA Programming Guide, "Asynchronous Concurrent Execution": work on a
  stream runs in order, asynchronously to the host): a copy, memset, kernel, TensorRT enqueue or graph
  launch runs at `Stream.synchronize()`, not when it is enqueued, and until then every host-visible
  byte it will write reads as 0xFF (NaN / -1): a host that reads a result before synchronizing sees
  garbage, as it may on the device.
- Device memory (`mem_alloc`) is mapped PROT_NONE: a host read or write of it crashes, as it would on
  the device; only device work reaches it. It comes filled with 0xFF bytes (NaN, -1): cuMemAlloc
  "The memory is not cleared", and a reused allocation holds what was there, so a buffer read before
  it is written reads garbage. Page-locked memory (`pagelocked_zeros`) is its own mapping,
  page-aligned; `get_device_pointer()` needs DEVICEMAP (cuMemHostGetDevicePointer: "the memory must
  have been allocated with CU_MEMHOSTALLOC_DEVICEMAP", else CUDA_ERROR_INVALID_VALUE) and is distinct
  from the host address; `free()` unmaps it (cuMemFreeHost), so a later touch crashes too.
- Copies: `memcpy_dtod_async` (1-D, no conditions); `Memcpy2D` between device addresses only with
  pitches a pitched allocation made (cuMemcpy2DAsync "may fail for pitches not computed by
  cuMemAllocPitch", and pycuda's async path never falls back to cuMemcpy2DUnaligned): refused
  otherwise. `memcpy_htod`, `memset_d8` are synchronous.
- Where a GPU was kinder than the documented contract, the double keeps the contract: on the H200
  (unified addressing) a pinned buffer allocated without DEVICEMAP had a device pointer, equal to its
  host address, and a 2-D copy with pitches of no pitched allocation ran. The backend asks for
  DEVICEMAP and uses only the device pointer, and copies with any pitches through its own kernel.
- Stream capture (`cuStreamBeginCapture_v2` in CU_STREAM_CAPTURE_MODE_THREAD_LOCAL): work enqueued on
  the capturing stream is recorded, not run; a potentially unsafe call from the capturing thread
  (cuThreadExchangeStreamCaptureMode: "some actions, such as a call to cudaMalloc, may be unsafe")
  fails and invalidates the capture: `cuStreamEndCapture` then returns
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph. An executable graph may be uploaded
  (`cuGraphUpload`), which is recorded. Which call fails how is what pycuda and
  libcuda did on a GPU (an H200, CUDA 13.0, pycuda 2026.1; `scripts/validate_cuda.py`'s rows and a
  probe of each call): allocations (cuMemAlloc, cuMemHostAlloc) and synchronizing the capturing
  stream raise CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ("operation not permitted when stream is
  capturing"); synchronous copies and memsets, which run on the legacy stream, raise
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ("operation would make the legacy stream depend on a capturing
  blocking stream"); loading a module returns success and invalidates the capture silently; creating
  a stream is allowed. pycuda raises all of them as LogicError. A graph is replayed by
  `cuGraphLaunch`; live graphs and executable graphs are counted, so a leak shows.
- libcudart keeps a per-thread last error; `cudaGetLastError()` returns and clears it (trtexec's
  endCaptureOnError calls it, samples/common/sampleDevice.h at v10.3.0). `RUNTIME` is the process's
  libcudart; TensorRT links its own statically (fake_trt.RUNTIME, another `CudaRuntime`), so a
  failed capture inside TensorRT leaves its error there, and clearing this one does not clear it.
- Kernels: `pycuda.compiler.compile` keeps the CUDA C source; `module_from_buffer` compiles it for
  this CPU with the host C++ compiler (blockIdx/threadIdx/blockDim/gridDim as globals, every block
  and thread run in turn), so a kernel's own indexing runs here. The blocks run in a shuffled order
  on every launch (Programming Guide, "Thread Hierarchy": blocks "must" be able to run "in any
  order"), so a kernel that counts on block order fails here. Pointer arguments are translated from
  device to host addresses; pointers a kernel reads from memory must be `mem_alloc` memory, whose
  device and host addresses are the same.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

DEVICE_OFFSET = 1 << 44
"""A mapped page-locked buffer's device pointer = its host address + this."""
POISON = 0xFF
_local = threading.local()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_NONE, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS = 0, 3, 0x22
PAGE = 4096


class Error(Exception):
    """pycuda.driver.Error."""


class LogicError(Error):
    """pycuda.driver.LogicError: an API call the driver refused."""


# ----------------------------------------------------------------------------------------- contexts


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
            raise LogicError("cuCtxPopCurrent failed: no current context")
        _local.stack = stack[:-1]

    def detach(self) -> None:
        if self.detached:
            raise LogicError("context already detached")
        self.detached = True


def current() -> Context | None:
    stack = getattr(_local, "stack", [])
    return stack[-1] if stack else None


class Device:
    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def retain_primary_context(self) -> Context:
        return Context()

    def name(self) -> str:
        return "CUDA double (CPU)"

    def compute_capability(self) -> tuple[int, int]:
        return 8, 7  # an Orin


def init() -> None:
    pass


# ----------------------------------------------------------------------------------------- memory


class Region:
    """One mapping: device memory (PROT_NONE to the host) or mapped page-locked host memory."""

    def __init__(self, nbytes: int, device: bool, pitch: int = 0) -> None:
        self.size = -(-max(nbytes, 1) // PAGE) * PAGE
        self.ptr = _libc.mmap(None, self.size, PROT_NONE if device else PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
        if self.ptr in (None, ctypes.c_void_p(-1).value):
            raise MemoryError("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")
        self.device, self.pitch, self.freed = device, pitch, False
        self.address = self.ptr if device else self.ptr + DEVICE_OFFSET  # where device work sees it
        if device:  # cuMemAlloc: "The memory is not cleared"; here it holds NaN-like bytes until written
            _libc.mprotect(self.ptr, self.size, PROT_READ_WRITE)
            ctypes.memset(self.ptr, POISON, self.size)
            if _access_depth[0] == 0:
                _libc.mprotect(self.ptr, self.size, PROT_NONE)
        _regions.append(self)
        CLAIMS[0] += 1

    def host(self) -> np.ndarray:
        return np.frombuffer((ctypes.c_byte * self.size).from_address(self.ptr), dtype=np.uint8)

    def release(self, call: str) -> None:
        if self.freed:
            raise LogicError(f"{call} failed: CUDA_ERROR_INVALID_VALUE (already freed)")
        _unsafe(call)
        for stream in _streams.values():
            for work in stream.pending:
                if any(self.address <= a < self.address + self.size for a, _ in work.touches):
                    raise LogicError(f"{call}: memory that {work.what} still uses was released before the stream "
                                     f"synchronized (undefined behavior)")
        self.freed = True
        _regions.remove(self)
        _libc.munmap(self.ptr, self.size)  # freed memory is unmapped: touching it crashes


_regions: list[Region] = []
_access_depth = [0]
CLAIMS = [0]
"""Every allocation ever made (device or page-locked): a test reads it before and after a run."""


def region_of(address: int, nbytes: int = 1) -> Region:
    for r in _regions:
        if r.address <= address and address + nbytes <= r.address + r.size:
            return r
    raise LogicError(f"illegal memory access: {nbytes} bytes at {address:#x} are not in any live allocation")


def device_view(address: int, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The bytes behind a device address (they must lie in one live allocation), as the device sees them."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    r = region_of(address, nbytes)
    start = address - r.address
    return r.host()[start:start + nbytes].view(dtype).reshape(shape)


def host_address(address: int) -> int:
    """Where a device address is in this process."""
    r = region_of(address)
    return r.ptr + (address - r.address)


@contextmanager
def device_access():
    """The device is working: device memory is readable and writable for the duration."""
    if _access_depth[0] == 0:
        for r in _regions:
            if r.device:
                _libc.mprotect(r.ptr, r.size, PROT_READ_WRITE)
    _access_depth[0] += 1
    try:
        yield
    finally:
        _access_depth[0] -= 1
        if _access_depth[0] == 0:
            for r in _regions:
                if r.device:
                    _libc.mprotect(r.ptr, r.size, PROT_NONE)


class DeviceAllocation:
    """`cuda.mem_alloc`: memory only device work reaches."""

    def __init__(self, nbytes: int, pitch: int = 0) -> None:
        _unsafe("cuMemAlloc")
        self.region = Region(nbytes, device=True, pitch=pitch)
        self.size = self.region.size

    def __int__(self) -> int:
        if self.region.freed:
            raise LogicError("use of a freed device allocation")
        return self.region.address

    @property
    def freed(self) -> bool:
        return self.region.freed

    def free(self) -> None:
        self.region.release("cuMemFree")


def mem_alloc(nbytes: int) -> DeviceAllocation:
    return DeviceAllocation(nbytes)


def mem_alloc_pitch(width: int, height: int, access_size: int) -> tuple[DeviceAllocation, int]:
    """cuMemAllocPitch: rows of `width` bytes padded to a pitch of 512 bytes (the pitch is what 2-D copies
    are guaranteed to take)."""
    pitch = -(-width // 512) * 512
    return DeviceAllocation(pitch * height, pitch=pitch), pitch


def mem_get_info() -> tuple[int, int]:
    used = sum(r.size for r in _regions if r.device)
    return 8 * 2**30 - used, 8 * 2**30


class HostAllocation:
    """A page-locked allocation (cuMemHostAlloc): the buffer its numpy array is built on (`.base`)."""

    region: Region
    flags: int

    def get_device_pointer(self) -> int:
        if self.region.freed:
            raise LogicError("cuMemHostGetDevicePointer failed: CUDA_ERROR_INVALID_VALUE (freed)")
        if not self.flags & host_alloc_flags.DEVICEMAP:
            raise LogicError("cuMemHostGetDevicePointer failed: CUDA_ERROR_INVALID_VALUE (not allocated with "
                             "CU_MEMHOSTALLOC_DEVICEMAP)")
        return self.region.address

    @property
    def freed(self) -> bool:
        return self.region.freed

    def free(self) -> None:
        self.region.release("cuMemFreeHost")


class host_alloc_flags:
    PORTABLE = 1
    DEVICEMAP = 2


def pagelocked_zeros(shape, dtype, order: str = "C", mem_flags: int = 0) -> np.ndarray:
    _unsafe("cuMemHostAlloc")
    dtype = np.dtype(dtype)
    nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
    region = Region(nbytes, device=False)  # fresh anonymous pages: zeroed, page-aligned
    allocation = type("HostAllocation", (HostAllocation, ctypes.c_byte * nbytes), {}).from_address(region.ptr)
    allocation.region, allocation.flags = region, mem_flags
    return np.ndarray(shape, dtype, buffer=allocation, order=order)  # .base: the allocation


# ----------------------------------------------------------------------------------------- streams


class Work:
    """One operation on a stream: what it does, the bytes it writes (host-visible ones read as garbage
    until it has run) and every address range it touches (none may be freed until it has run)."""

    def __init__(self, run: Callable[[], None], writes: list[tuple[int, int]], what: str,
                 touches: list[tuple[int, int]] | None = None) -> None:
        self.run, self.writes, self.what = run, writes, what
        self.touches = [*writes, *(touches or [])]
        self.activations: int | None = None


_streams: dict[int, Stream] = {}
LEGACY_STREAM = 0


class Stream:
    def __init__(self, flags: int = 0) -> None:
        self.handle = id(self)
        self.pending: list[Work] = []
        self.captured: list[Work] | None = None
        self.capture_thread: int | None = None
        self.invalidated = False
        self.poisoned: list[tuple[np.ndarray, np.ndarray]] = []
        self.operations = 0
        """Every operation ever put on the stream (graph launches count one each)."""
        _streams[self.handle] = self

    def synchronize(self) -> None:
        if self.captured is not None:
            self.invalidated = True
            raise LogicError(f"cuStreamSynchronize failed: {REFUSALS['unsupported']}")
        _unsafe("cuStreamSynchronize")
        for host, saved in reversed(self.poisoned):  # the device's view: nothing was written yet
            host[...] = saved
        self.poisoned.clear()
        work, self.pending = self.pending, []
        with device_access():
            for item in work:
                item.run()

    def is_done(self) -> bool:
        return not self.pending

    def enqueue(self, work: Work) -> None:
        """Record `work` while the stream captures; otherwise queue it until synchronize()."""
        if current() is None:
            raise LogicError(f"{work.what} failed: CUDA_ERROR_INVALID_CONTEXT (no current context)")
        self.operations += 1
        if self.captured is not None:
            self.captured.append(work)
            return
        for address, nbytes in work.writes:
            r = region_of(address, nbytes)
            if not r.device:  # a host that reads it before synchronizing sees garbage
                host = device_view(address, (nbytes,), np.uint8)
                self.poisoned.append((host, host.copy()))
                host[...] = POISON
        self.pending.append(work)


def stream_of(handle) -> Stream | None:
    """The stream of a handle: 0 is the legacy default stream, always there."""
    handle = getattr(handle, "value", handle) or LEGACY_STREAM
    if handle == LEGACY_STREAM and LEGACY_STREAM not in _streams:
        legacy = Stream()
        _streams.pop(legacy.handle)
        legacy.handle = LEGACY_STREAM
        _streams[LEGACY_STREAM] = legacy
    return _streams.get(handle)


def capturing() -> Stream | None:
    """The stream this thread is capturing (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), if any."""
    me = threading.get_ident()
    return next((s for s in _streams.values() if s.captured is not None and s.capture_thread == me), None)


REFUSALS = {"unsupported": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (operation not permitted when stream is capturing)",
            "implicit": "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (operation would make the legacy stream depend on a "
                        "capturing blocking stream)"}
"""How the driver refuses a call while this thread captures: an unsafe call, or one on the legacy stream."""


def _unsafe(call: str, refusal: str = "unsupported") -> None:
    """A potentially unsafe API call: refused, and the capture invalidated, while this thread captures."""
    stream = capturing()
    if stream is not None:
        stream.invalidated = True
        raise LogicError(f"{call} failed: {REFUSALS[refusal]}")


# ----------------------------------------------------------------------------------------- copies


def memcpy_htod(dest: int, src: np.ndarray) -> None:
    """Synchronous host-to-device copy (on the legacy stream: waits for every stream)."""
    _unsafe("cuMemcpyHtoD", "implicit")
    _drain()
    with device_access():
        device_view(int(dest), (src.nbytes,), np.uint8)[...] = np.ascontiguousarray(src).view(np.uint8).reshape(-1)


def memset_d8(dest: int, data: int, size: int) -> None:
    _unsafe("cuMemsetD8", "implicit")
    _drain()
    with device_access():
        device_view(int(dest), (size,), np.uint8)[...] = data


def _drain() -> None:
    """The legacy stream synchronizes with every other stream."""
    for stream in list(_streams.values()):
        if stream.captured is None and stream.pending:
            stream.synchronize()


def memset_d8_async(dest: int, data: int, size: int, stream: Stream | None = None) -> None:
    view = device_view(int(dest), (size,), np.uint8)  # an illegal address fails at the call

    def run() -> None:
        view[...] = data
    _on(stream, "cuMemsetD8Async").enqueue(Work(run, [(int(dest), size)], "cuMemsetD8Async"))


def memcpy_dtod_async(dest: int, src: int, size: int, stream: Stream | None = None) -> None:
    dst_view = device_view(int(dest), (size,), np.uint8)
    src_view = device_view(int(src), (size,), np.uint8)

    def run() -> None:
        dst_view[...] = src_view
    _on(stream, "cuMemcpyDtoDAsync").enqueue(Work(run, [(int(dest), size)], "cuMemcpyDtoDAsync", [(int(src), size)]))


def _on(stream: Stream | None, call: str) -> Stream:
    if not isinstance(stream, Stream):
        raise LogicError(f"{call}: the backend's work belongs on its stream, got {stream!r}")
    return stream


class Memcpy2D:
    """cuMemcpy2DAsync between device addresses, with pitches that pitched allocations computed."""

    def __init__(self) -> None:
        self.src_pitch = self.dst_pitch = self.width_in_bytes = self.height = 0
        self.src = self.dst = None

    def set_src_device(self, address: int) -> None:
        self.src = int(address)

    def set_dst_device(self, address: int) -> None:
        self.dst = int(address)

    def __call__(self, stream: Stream | None = None) -> None:
        w, h = self.width_in_bytes, self.height
        if self.src is None or self.dst is None or w <= 0 or h <= 0 or self.src_pitch < w or self.dst_pitch < w:
            raise LogicError("cuMemcpy2DAsync failed: CUDA_ERROR_INVALID_VALUE")
        for address, pitch in ((self.src, self.src_pitch), (self.dst, self.dst_pitch)):
            if region_of(address).pitch != pitch:  # "may fail for pitches not computed by cuMemAllocPitch"
                raise LogicError(f"cuMemcpy2DAsync failed: CUDA_ERROR_INVALID_VALUE (pitch {pitch} was not computed "
                                 f"by cuMemAllocPitch)")
        src = device_view(self.src, ((h - 1) * self.src_pitch + w,), np.uint8)
        dst = device_view(self.dst, ((h - 1) * self.dst_pitch + w,), np.uint8)
        src_rows = np.lib.stride_tricks.as_strided(src, (h, w), (self.src_pitch, 1))
        dst_rows = np.lib.stride_tricks.as_strided(dst, (h, w), (self.dst_pitch, 1))

        def run() -> None:
            dst_rows[...] = src_rows
        _on(stream, "cuMemcpy2DAsync").enqueue(Work(run, [(self.dst, (h - 1) * self.dst_pitch + w)], "cuMemcpy2DAsync"))


# ----------------------------------------------------------------------------------------- kernels

_PRELUDE = """
#include <cstdint>
struct uint3 { unsigned x, y, z; };
static uint3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __restrict__
"""
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)
_BUILT: dict[str, ctypes.CDLL] = {}
BLOCK_ORDER = np.random.default_rng(87)
"""Shuffles each launch's blocks (CUDA Programming Guide, "Thread Hierarchy": "Thread blocks are
required to execute independently: It must be possible to execute them in any order")."""


def compile(source: str, arch: str | None = None, options=None, **_) -> bytes:
    """pycuda.compiler.compile: here the "cubin" is the source itself."""
    return b"CUDA-DOUBLE\n" + source.encode()


def module_from_buffer(data: bytes, options=None) -> Module:
    stream = capturing()
    if stream is not None:  # the load succeeds; the capture is lost, which only cuStreamEndCapture says
        stream.invalidated = True
    head, _, source = bytes(data).partition(b"\n")
    if head != b"CUDA-DOUBLE":
        raise LogicError("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE")
    return Module(source.decode())


class Module:
    """The CUDA source compiled for this CPU: each kernel behind a launcher that runs every block, in
    the order it is given, and every thread of it in turn."""

    def __init__(self, source: str) -> None:
        kernels = {name: _params(params) for name, params in _KERNEL.findall(source)}
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        if key not in _BUILT:
            launchers = "".join(_launcher(name, types) for name, types in kernels.items())
            work = Path(tempfile.mkdtemp(prefix="cuda-double-"))
            (work / "k.cpp").write_text(_PRELUDE + source + launchers)
            subprocess.run(["c++", "-O1", "-shared", "-fPIC", "-o", str(work / "k.so"), str(work / "k.cpp")],
                           check=True, capture_output=True, text=True)
            _BUILT[key] = ctypes.CDLL(str(work / "k.so"))
        self.lib, self.kernels = _BUILT[key], kernels

    def get_function(self, name: str) -> Function:
        if name not in self.kernels:
            raise LogicError(f"cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND ({name})")
        return Function(self, name)


def _params(text: str) -> list[str]:
    """The C types of a kernel's parameters."""
    return [re.sub(r"\w+\s*$", "", p.strip()).strip() for p in text.split(",") if p.strip()]


def _launcher(name: str, types: list[str]) -> str:
    args = ", ".join(f"*({t}*)p[{i}]" for i, t in enumerate(types))
    return f"""
extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void** p,
                              const unsigned* block_order_) {{
    gridDim = uint3{{gx, gy, gz}}; blockDim = uint3{{bx, by, bz}};
    for (unsigned long i = 0; i < (unsigned long)gx * gy * gz; ++i) {{
        unsigned b = block_order_[i], x = b % gx, y = b / gx % gy, z = b / gx / gy;
        for (unsigned tz = 0; tz < bz; ++tz) for (unsigned ty = 0; ty < by; ++ty) for (unsigned tx = 0; tx < bx; ++tx) {{
            blockIdx = uint3{{x, y, z}}; threadIdx = uint3{{tx, ty, tz}};
            {name}({args});
        }}
    }}
}}
"""


CTYPES = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "l": ctypes.c_int64,
          "Q": ctypes.c_uint64}


class Function:
    def __init__(self, module: Module, name: str) -> None:
        self.module, self.name = module, name
        self.arg_format: str | None = None
        self.launches = 0

    def prepare(self, arg_types: str) -> Function:
        if len(arg_types) != len(self.module.kernels[self.name]) or set(arg_types) - set(CTYPES):
            raise LogicError(f"{self.name}: argument format {arg_types!r} does not match its "
                             f"{len(self.module.kernels[self.name])} parameters")
        self.arg_format = arg_types
        return self

    def prepared_async_call(self, grid, block, stream: Stream | None, *args) -> None:
        """cuLaunchKernel on `stream`: the kernel runs when the stream does."""
        if self.arg_format is None or len(args) != len(self.arg_format):
            raise LogicError(f"{self.name}: prepared with {self.arg_format!r}, called with {len(args)} arguments")
        grid3 = (*grid, 1, 1)[:3]
        if len(block) != 3 or min(*grid3, *block) < 1 or block[0] * block[1] * block[2] > 1024:
            raise LogicError(f"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE (grid {grid}, block {block})")
        values = [CTYPES[f](host_address(int(a)) if f == "P" and int(a) else int(a)) for f, a in zip(self.arg_format, args)]
        launch = getattr(self.module.lib, f"launch_{self.name}")

        def run() -> None:
            params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
            order = np.ascontiguousarray(BLOCK_ORDER.permutation(grid3[0] * grid3[1] * grid3[2]), np.uint32)
            launch(*map(ctypes.c_uint, (*grid3, *block)), params, order.ctypes.data_as(ctypes.c_void_p))
            self.launches += 1
        pointers = [(int(a), 1) for f, a in zip(self.arg_format, args) if f == "P" and int(a)]
        _on(stream, "cuLaunchKernel").enqueue(Work(run, [], f"cuLaunchKernel({self.name})", pointers))


# ----------------------------------------------------------------------------------------- libcuda (graphs)

CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE = 0, 1, 400
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 900, 901
_NAMES = {CUDA_ERROR_INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE", CUDA_ERROR_INVALID_HANDLE: b"CUDA_ERROR_INVALID_HANDLE",
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: b"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
          CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: b"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}


class Driver:
    """libcuda's graph calls as `edged.backends.cuda_graph` makes them (ctypes handles, byref outs)."""

    def __init__(self) -> None:
        self.graphs: dict[int, list[Work]] = {}
        self.execs: dict[int, list[Work]] = {}
        self.launches = 0
        self.uploaded: set[int] = set()
        self.launched_before_upload = 0
        """Launches of an executable graph not uploaded (cuGraphUpload) before."""
        self.fail_instantiate = False
        """Set by a test: the next instantiations fail (a graph the device cannot run)."""
        self._next = 1

    def _handle(self) -> int:
        self._next += 1
        return self._next << 8

    def cuStreamBeginCapture_v2(self, stream, mode: int) -> int:
        s = _streams.get(getattr(stream, "value", stream))
        if s is None or s.captured is not None or current() is None or mode != 1 or s.handle == LEGACY_STREAM:
            return CUDA_ERROR_INVALID_VALUE  # a thread-local capture, on a stream of our own
        s.captured, s.capture_thread, s.invalidated = [], threading.get_ident(), False
        return CUDA_SUCCESS

    def cuStreamEndCapture(self, stream, graph_out) -> int:
        s = _streams.get(getattr(stream, "value", stream))
        if s is None or s.captured is None:
            return CUDA_ERROR_INVALID_VALUE
        work, s.captured, s.capture_thread = s.captured, None, None
        if s.invalidated:
            graph_out._obj.value = None
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        handle = self._handle()
        self.graphs[handle] = work
        graph_out._obj.value = handle
        return CUDA_SUCCESS

    def cuGraphInstantiateWithFlags(self, exec_out, graph, flags: int) -> int:
        work = self.graphs.get(getattr(graph, "value", graph))
        if work is None:
            return CUDA_ERROR_INVALID_HANDLE
        if self.fail_instantiate:
            return CUDA_ERROR_INVALID_VALUE
        handle = self._handle()
        self.execs[handle] = list(work)
        exec_out._obj.value = handle
        return CUDA_SUCCESS

    def cuGraphLaunch(self, graph_exec, stream) -> int:
        work, s = self.execs.get(getattr(graph_exec, "value", graph_exec)), _streams.get(getattr(stream, "value", stream))
        if work is None or s is None or current() is None:
            return CUDA_ERROR_INVALID_HANDLE
        writes = [w for item in work for w in item.writes]
        touches = [t for item in work for t in item.touches]

        def run() -> None:
            for item in work:
                item.run()
        s.enqueue(Work(run, writes, "cuGraphLaunch", touches))
        self.launches += 1
        self.launched_before_upload += getattr(graph_exec, "value", graph_exec) not in self.uploaded
        return CUDA_SUCCESS

    def cuGraphUpload(self, graph_exec, stream) -> int:
        """Uploads the executable graph in `stream` without executing it (cuda.h, cuGraphUpload); here
        it is recorded, so a test sees which graphs a step launches without an upload first."""
        handle = getattr(graph_exec, "value", graph_exec)
        s = _streams.get(getattr(stream, "value", stream))
        if handle not in self.execs or s is None or current() is None:
            return CUDA_ERROR_INVALID_HANDLE
        self.uploaded.add(handle)
        return CUDA_SUCCESS

    def cuGraphExecDestroy(self, graph_exec) -> int:
        return CUDA_SUCCESS if self.execs.pop(getattr(graph_exec, "value", graph_exec), None) is not None \
            else CUDA_ERROR_INVALID_HANDLE

    def cuGraphDestroy(self, graph) -> int:
        return CUDA_SUCCESS if self.graphs.pop(getattr(graph, "value", graph), None) is not None \
            else CUDA_ERROR_INVALID_HANDLE

    def cuGetErrorName(self, result: int, name_out) -> int:
        name_out._obj.value = _NAMES.get(result, b"CUDA_ERROR_UNKNOWN")
        return CUDA_SUCCESS


class CudaRuntime:
    """libcudart's per-thread last error."""

    def __init__(self) -> None:
        self.errors: dict[int, int] = {}

    def fail(self, error: int) -> None:
        self.errors[threading.get_ident()] = error

    def peek(self) -> int:
        return self.errors.get(threading.get_ident(), 0)

    def cudaGetLastError(self) -> int:
        return self.errors.pop(threading.get_ident(), 0)


RUNTIME = CudaRuntime()
