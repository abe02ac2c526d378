"""The TensorRT backend's CUDA side, which needs pycuda and no TensorRT: the device's context, the one
stream, the buffers, copies, zeroing and the kernels' K/V append.

Memory. On Jetson the CPU and GPU share DRAM, but pinned host memory is uncached for the GPU: right
for the small I/O the host reads or writes every step (codes, sampling inputs, noise, PCM), which
lives in mapped pinned buffers (`empty`: `cuda.pagelocked_zeros(..., DEVICEMAP)`, read in place, no
copies), and wrong for what only the engines read, the KV cache, the vocoder state and the code
predictor's heads, which live in device memory (`device_empty`, `device_from`: `cuda.mem_alloc`).
The host never touches device memory: K/V rows are appended by a kernel (`kernels.py`, one
`AppendLaunch` per plan), state is copied and zeroed by `copy` / `zero`, on the one stream, ordered
with the engines' work.

`CudaDevice` pushes the device's primary CUDA context when it is made and pops (and detaches) it in
`release_cuda()`, after freeing the buffers: a context left on the stack makes pycuda abort the
process at exit. `scripts/validate_cuda.py` runs this module on any NVIDIA GPU.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import kernels
from edged.backends.base import Append, EngineError, block, copy_rows

try:  # optional: pycuda built against the installed CUDA (scripts/install-jetson.sh)
    import pycuda.driver as cuda
except ImportError as exc:  # the message says what to install
    raise ImportError("the tensorrt backend needs pycuda (on JetPack: scripts/install-jetson.sh)") from exc


class CudaDevice:
    """One GPU's context, stream and buffers, and the kernels once `load_kernels` found them."""

    def __init__(self, device: int = 0):
        cuda.init()
        self.device = cuda.Device(device)
        self.cuda_context = self.device.retain_primary_context()
        self.cuda_context.push()
        self.stream = cuda.Stream()
        self.buffers: list[np.ndarray] = []
        self.device_memory: list[Any] = []
        self.tables: dict[bytes, np.ndarray] = {}  # append tables by content, every one claimed at boot
        self.kernels: Kernels | None = None
        self.launches = 0
        self.sealed = False  # after boot: nothing more is claimed

    def seal(self) -> None:
        """Boot is over: from here on a claim of device or pinned memory is an error (`claim`)."""
        self.sealed = True

    def claim(self, what: str) -> None:
        """Refuse `what` after boot: the daemon claims every buffer it will ever use at boot."""
        if self.sealed:
            raise EngineError(f"{what} after boot: every buffer is claimed at boot (a plan bound later must be "
                              f"reserved then: Engine.reserve)")

    def load_kernels(self, path: Path) -> None:
        """The kernels of kernels.cubin at `path`, built for this GPU (once)."""
        if self.kernels is None:
            self.kernels = Kernels(path, self.device)

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        self.claim(f"pinned memory {list(shape)}")
        buf = cuda.pagelocked_zeros(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)  # page-aligned
        self.buffers.append(buf)
        return buf

    def device_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Device memory, zeroed (cuMemAlloc does not clear it); the array describes it (shape, strides,
        address) and is never read or written by the host: only engines, kernels, `copy` and `zero`
        touch it."""
        self.claim(f"device memory {list(shape)}")
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
        """`table` in device memory, once per distinct content: after boot only a table reserved at
        boot (`reserve_tables`) is found, and nothing is claimed."""
        key = table.tobytes()
        if key not in self.tables:
            self.reserve_tables([table])
        return self.tables[key]

    def reserve_tables(self, tables: list[np.ndarray]) -> int:
        """The tables not yet in device memory, in one block claimed now (boot only), one synchronous
        copy; returns the bytes claimed."""
        new: dict[bytes, np.ndarray] = {}
        for table in tables:
            new.setdefault(table.tobytes(), table.view(np.uint8).reshape(-1))
        for key in self.tables:
            new.pop(key, None)
        if not new:
            return 0
        self.claim(f"{len(new)} K/V append table(s)")
        claimed = self.device_from(np.concatenate(list(new.values())))
        at = 0
        for key, table in new.items():  # each a whole number of 72-byte rows: every table stays 8-byte aligned
            self.tables[key] = claimed[at:at + table.size]
            at += table.size
        return claimed.nbytes

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

    def release_cuda(self) -> None:
        """The kernels and buffers, then the stream, then pop and detach the CUDA context (after the
        stream was synchronized and whatever ran on these buffers was released)."""
        self.kernels = None
        for buf in self.buffers:
            _allocation(buf)[0].free()
        self.buffers.clear()
        for allocation in self.device_memory:
            allocation.free()
        self.device_memory.clear()
        self.stream = None
        cuda.Context.pop()
        self.cuda_context.detach()


def append_table(append: Append) -> np.ndarray:
    """The `append_rows` kernel's table for `append`: one `kernels.ROWS` per (cache, rows) pair."""
    table = np.zeros(len(append.rows), kernels.ROWS)
    for i, r in enumerate(append.rows):
        width, runs, cache_pitch, rows_pitch = copy_rows(block(r.cache[0], r.axis - 1, r.rows.shape[r.axis]),
                                                         r.rows[0])
        table[i] = (device_address(r.cache), device_address(r.rows), r.cache.strides[0], r.rows.strides[0],
                    cache_pitch, rows_pitch, r.cache.strides[r.axis], runs, width)
    return table


class AppendLaunch:
    """One `append_rows` launch: the table of every (cache, rows) pair in device memory, made at boot
    (or reserved then, for a plan bound later)."""

    def __init__(self, device: CudaDevice, append: Append):
        table = append_table(append)
        self.table = device.device_table(table.view(np.uint8))
        n = append.rows[0].rows.shape[0]
        self.grid = (kernels.grid(int((table["runs"] * table["width"]).max())), len(table), n)
        self.args = (device_address(self.table), device_address(append.positions),
                     0 if append.slots is None else device_address(append.slots),
                     0 if append.active is None else device_address(append.active))
        self.device = device

    def launch(self) -> None:
        d = self.device
        if d.kernels is None:
            raise EngineError("a K/V append needs the kernels, which come with the plans: load an engine first")
        d.kernels.append_rows.prepared_async_call(self.grid, (kernels.THREADS, 1, 1), d.stream, *self.args)
        d.launches += 1


class Kernels:
    """The kernels of `kernels.py`, loaded from the cubin `edged-engines plans` built for this GPU."""

    def __init__(self, path: Path, device):
        major, minor = device.compute_capability()
        module = cuda.module_from_buffer(kernels.read(path, f"sm_{major}{minor}"))
        self.module = module
        self.append_rows = module.get_function("append_rows").prepare("PPPP")
        self.copy_rows = module.get_function("copy_rows").prepare("PPqqqq")


class DeviceArray(np.ndarray):
    """An array describing device memory: its repr (a log line, a traceback) never reads it."""

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, address={self.ctypes.data:#x})"

    __str__ = __repr__


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
