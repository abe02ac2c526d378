"""The TensorRT backend's two CUDA kernels: rows appended into a cache at each member's position, and
a 2-D copy with any pitches.

Why kernels and not driver copies: a K/V append writes each member's new rows at that member's own
position, so with copies it is one cuMemcpy2DAsync per layer, side and member (about 370 Python-driven
launches per step at batch 4 for a 28-layer talker), with pitches that cuMemAllocPitch did not
compute ("cuMemcpy2DAsync may fail for pitches not computed by cuMemAllocPitch", and pycuda's async
path never falls back to cuMemcpy2DUnaligned). `append_rows` reads the positions (and which members
step) from the plan's own bound buffers when it runs, so one launch appends every layer's K and V for
the whole cohort and is captured inside the step's CUDA graph. A kernel has no pitch conditions.

Built on the device by `edged-engines plans` (`build`, with nvcc through pycuda) into
`kernels.cubin` beside the plans, stamped with the source's hash and the GPU's compute capability
(a stale one is refused, naming the rebuild); loaded at boot by `Kernels`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from edged.backends.base import EngineError
from edged.backends.plan_file import REBUILD

SOURCE = r"""
struct Rows {
    unsigned long long cache, rows;       // device addresses: the cache's member 0 at position 0, member 0's rows
    long long cache_member, rows_member;  // bytes from one member to the next
    long long cache_pitch, rows_pitch;    // bytes from one run of the block to the next
    long long position;                   // bytes per position along the cache's sequence axis
    long long runs, width;                // the block: `runs` runs of `width` contiguous bytes
};

// For every block (blockIdx.y) and member m (blockIdx.z) that is active: member m's rows into the
// cache of slot slots[m] (m without slots) at position positions[m].
extern "C" __global__ void append_rows(const Rows* blocks, const long long* positions, const long long* slots,
                                       const unsigned char* active)
{
    const unsigned m = blockIdx.z;
    if (active && !active[m]) return;
    const Rows b = blocks[blockIdx.y];
    const long long slot = slots ? slots[m] : (long long)m;
    unsigned char* dst = (unsigned char*)(b.cache + slot * b.cache_member + positions[m] * b.position);
    const unsigned char* src = (const unsigned char*)(b.rows + m * b.rows_member);
    const long long total = b.runs * b.width;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long run = i / b.width, at = i - run * b.width;
        dst[run * b.cache_pitch + at] = src[run * b.rows_pitch + at];
    }
}

extern "C" __global__ void copy_rows(unsigned char* dst, const unsigned char* src, long long dst_pitch,
                                     long long src_pitch, long long width, long long height)
{
    const long long total = width * height;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / width, at = i - row * width;
        dst[row * dst_pitch + at] = src[row * src_pitch + at];
    }
}
"""
SOURCE_SHA256 = hashlib.sha256(SOURCE.encode()).hexdigest()
FILE = "kernels.cubin"
MAGIC = "edged-kernels"
THREADS = 256
ROWS = np.dtype([("cache", "<u8"), ("rows", "<u8"), ("cache_member", "<i8"), ("rows_member", "<i8"),
                 ("cache_pitch", "<i8"), ("rows_pitch", "<i8"), ("position", "<i8"), ("runs", "<i8"),
                 ("width", "<i8")])
"""One `Rows` of the kernel's table (nine 8-byte fields, as the C struct lays them out)."""


def build(out_dir: Path, arch: str) -> Path:
    """Compile the kernels for `arch` (e.g. sm_87) into out_dir/kernels.cubin, stamped (needs nvcc: on
    PATH, or in $CUDA_HOME/bin, default /usr/local/cuda)."""
    from pycuda.compiler import compile as compile_cuda

    nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    cubin = compile_cuda(SOURCE, nvcc=nvcc, arch=arch, no_extern_c=True)
    path = out_dir / FILE
    with open(path, "wb") as f:
        f.write(json.dumps({"magic": MAGIC, "source_sha256": SOURCE_SHA256, "arch": arch}).encode() + b"\n")
        f.write(cubin)
    return path


def read(path: Path, arch: str) -> bytes:
    """The cubin of kernels.cubin, if it was built from this source for this GPU."""
    if not path.is_file():
        raise EngineError(f"{path.name}: no CUDA kernels beside the plans ({REBUILD})")
    head, _, cubin = path.read_bytes().partition(b"\n")
    try:
        stamp = json.loads(head)
    except ValueError:
        stamp = None
    if not isinstance(stamp, dict) or stamp.get("magic") != MAGIC:
        raise EngineError(f"{path.name}: not written by edged-engines plans ({REBUILD})")
    if stamp.get("source_sha256") != SOURCE_SHA256 or stamp.get("arch") != arch:
        raise EngineError(f"{path.name}: built from other kernels or for {stamp.get('arch')}, this GPU is {arch} "
                          f"({REBUILD})")
    return cubin


def grid(nbytes: int) -> int:
    """Blocks of THREADS threads for a copy of `nbytes` bytes (each thread strides over the rest)."""
    return max(1, min(-(-nbytes // THREADS), 1024))
