#!/usr/bin/env python3
"""The TensorRT backend's CUDA side on any NVIDIA GPU, without TensorRT: one command, one summary.

    python scripts/validate_cuda.py [--rounds 200]      # needs pycuda and nvcc (PATH or $CUDA_HOME/bin)

`edged/backends/cuda_device.py` (the context, the stream, mapped pinned and device buffers, copies,
zeroing, the K/V append kernel) and `cuda_graph.py` (capture and replay through libcuda), run on the
GPU, each result against what the host computes. `scripts/validate_jetson.sh` runs these rows too;
CI runs them through the test doubles (tests/backends/test_validate_cuda.py). Rows:

1. device: the GPU, its compute capability, pycuda's version;
2. kernels: `kernels.build` compiles the backend's CUDA source with nvcc for this GPU, and
   `CudaDevice.load_kernels` loads the stamped cubin;
3. K/V append: one `AppendLaunch` for a cohort of 4 (members in slots 5, 0, 3, 2, the second one not
   active, 2 new rows each at its own position) into fp16 keys [slots, heads, dim, positions] and
   fp32 values [slots, heads, positions, dim] in device memory, positions, slots and the active mask
   in mapped pinned memory: the caches equal `Append.apply` on host copies, bit for bit;
4. copies: `copy` through the 2-D kernel (different pitches) and as one contiguous copy, `zero`;
   fresh memory: `device_empty` over memory just freed with 0xFF bytes in it reads zeros (cuMemAlloc
   does not clear what it returns; the test doubles fill it with 0xFF bytes);
5. CUDA graph: the append and a 2-D copy captured once, replayed for 3 rounds of new positions and
   active masks written by the host into the pinned buffers between launches: each round equals the
   host's (a captured kernel reads its positions when it runs); then microseconds per round-trip
   (launch + synchronize) of the graph and of the same work enqueued, over `--rounds`;
6. failed capture: a synchronous memset inside a capture is refused (pycuda raises; the row prints
   what), the capture ends with an error and no graph, the stream works after it (the test doubles'
   rule, tests/support/fake_cuda.py);
7. Graph after a failed capture: `cuda_graph.Graph` over an enqueue that does the same raises and
   cleans up (clearing the process's libcudart.so.12 last error, or, where there is none to load, a
   log line, and the cleanup goes on; the row says which), and the next capture works.

The test doubles run a kernel's blocks in a shuffled order and keep TensorRT's last error apart from
the process libcudart's (tests/support/fake_cuda.py, fake_trt.py); these rows hold under both.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from summary import Summary

from edged.backends import cuda_graph, kernels
from edged.backends.base import Append, Rows

SLOTS, HEADS, DIM, POSITIONS, T = 6, 2, 64, 40, 2
MEMBER_SLOTS = [5, 0, 3, 2]
AXES = (3, 2)
"""The sequence axis of the keys [slots, heads, dim, positions] and of the values [slots, heads, positions, dim]."""
ROUNDS = [([3, 9, 0, 37], [1, 0, 1, 1]), ([5, 11, 2, 38], [1, 1, 1, 1]), ([30, 0, 17, 6], [0, 1, 1, 0])]
"""(positions, active) of the cohort's members at each replay of the graph."""


def read(device, array: np.ndarray) -> np.ndarray:
    """A device array's bytes, through a mapped pinned buffer (the host never reads device memory)."""
    host = device.empty(array.shape, array.dtype)
    device.copy(host, array)
    device.sync()
    return host.copy()


class Cohort:
    """The append's caches and rows on the device, with host twins that `Append.apply` keeps."""

    def __init__(self, device, rng: np.random.Generator):
        self.device = device
        caches = [rng.standard_normal((SLOTS, HEADS, DIM, POSITIONS)).astype(np.float16),
                  rng.standard_normal((SLOTS, HEADS, POSITIONS, DIM)).astype(np.float32)]
        rows = [rng.standard_normal((4, HEADS, DIM, T)).astype(np.float16),
                rng.standard_normal((4, HEADS, T, DIM)).astype(np.float32)]
        self.positions = device.empty((4,), np.int64)
        self.slots = device.empty((4,), np.int64)
        self.active = device.empty((4,), np.uint8)
        self.slots[:] = MEMBER_SLOTS
        self.caches = [device.device_from(c) for c in caches]
        self.host = Append(tuple(Rows(c, r, axis) for c, r, axis in zip(caches, rows, AXES)),
                           self.positions, self.slots, self.active)
        self.append = Append(tuple(Rows(c, device.device_from(r), axis) for c, r, axis in
                                   zip(self.caches, rows, AXES)), self.positions, self.slots, self.active)
        self.append.check()

    def set(self, positions: list[int], active: list[int]) -> None:
        self.positions[:] = positions
        self.active[:] = active

    def equal(self) -> bool:
        """The device caches equal the host twins (after the host twins were appended to)."""
        return all(np.array_equal(read(self.device, d), r.cache) for d, r in zip(self.caches, self.host.rows))


class Copies:
    """A 2-D copy between buffers of different pitches, with its host twin."""

    def __init__(self, device, rng: np.random.Generator):
        self.device = device
        self.src_host = rng.standard_normal((8, 48, 40)).astype(np.float32)
        self.dst_host = rng.standard_normal((8, 64, 40)).astype(np.float32)
        self.src, self.dst = device.device_from(self.src_host), device.device_from(self.dst_host)

    def enqueue(self) -> None:
        self.device.copy(self.dst[:, 3:51], self.src)

    def apply(self) -> None:
        self.dst_host[:, 3:51] = self.src_host

    def equal(self) -> bool:
        return np.array_equal(read(self.device, self.dst), self.dst_host)


def check_kernels(device, summary: Summary) -> bool:
    major, minor = device.device.compute_capability()
    arch = f"sm_{major}{minor}"
    with tempfile.TemporaryDirectory(prefix="edged-kernels-") as out:
        try:
            path = kernels.build(Path(out), arch)
            device.load_kernels(path)
        except Exception as exc:  # the row says why; nothing after it can run
            summary.add("kernels", False, f"{arch}: {type(exc).__name__}: {exc}")
            return False
        summary.add("kernels", True, f"built for {arch} by nvcc ({path.stat().st_size} bytes), loaded")
    return True


def check_append(device, summary: Summary, rng: np.random.Generator) -> None:
    from edged.backends.cuda_device import AppendLaunch

    cohort = Cohort(device, rng)
    cohort.set([7, 2, 0, POSITIONS - T], [1, 0, 1, 1])
    AppendLaunch(device, cohort.append).launch()
    cohort.host.apply()
    device.sync()
    summary.add("K/V append", cohort.equal(), "4 members into fp16 keys [S, H, D, P] and fp32 values [S, H, P, D], "
                "slots 5 0 3 2, the second member inactive: equal to Append.apply bit for bit")


def check_copies(device, summary: Summary, rng: np.random.Generator) -> None:
    copies = Copies(device, rng)
    copies.enqueue()
    copies.apply()
    flat_host = rng.standard_normal((3, 100)).astype(np.float32)
    flat, whole = device.device_from(flat_host), device.device_from(np.zeros((3, 100), np.float32))
    device.copy(whole, flat)
    device.zero(whole[1])
    flat_host[1] = 0
    device.sync()
    summary.add("copies", copies.equal() and np.array_equal(read(device, whole), flat_host),
                "2-D kernel (pitches 10240 / 7680 bytes), one contiguous copy, zero of a row: equal to the host's")


def check_fresh_memory(device, summary: Summary) -> None:
    import pycuda.driver as cuda

    used = cuda.mem_alloc(1 << 16)
    cuda.memset_d8(int(used), 0xFF, 1 << 16)
    used.free()
    fresh = device.device_empty((1 << 14,), np.float32)
    summary.add("fresh memory", not read(device, fresh).any(),
                "device_empty over memory just freed with 0xFF bytes in it: zeros")


def check_graph(device, summary: Summary, rng: np.random.Generator, rounds: int) -> None:
    from edged.backends.cuda_device import AppendLaunch

    cohort, copies = Cohort(device, rng), Copies(device, rng)
    launch = AppendLaunch(device, cohort.append)

    def enqueue() -> None:
        launch.launch()
        copies.enqueue()

    graph = cuda_graph.Graph(device.stream.handle, enqueue)
    try:
        equal = []
        for positions, active in ROUNDS:
            cohort.set(positions, active)
            graph.launch()
            cohort.host.apply()
            copies.apply()
            device.sync()
            equal.append(cohort.equal() and copies.equal())
        timed = {"graph": graph.launch, "enqueued": enqueue}
        us = {}
        for way, run in timed.items():
            t0 = time.perf_counter()
            for _ in range(rounds):
                run()
                device.sync()
            us[way] = (time.perf_counter() - t0) * 1e6 / rounds
    finally:
        graph.close()
    summary.add("CUDA graph", all(equal), f"3 replays with new positions and active members: equal {equal}; "
                f"round-trip {us['graph']:.1f} us replayed, {us['enqueued']:.1f} us enqueued ({rounds} rounds)")


def check_failed_capture(device, summary: Summary, rng: np.random.Generator) -> None:
    import pycuda.driver as cuda

    from edged.backends.cuda_device import device_address

    lib = cuda_graph.driver()
    copies = Copies(device, rng)

    def unsafe() -> None:  # synchronous, on the legacy stream: no capture can hold it
        cuda.memset_d8(device_address(copies.src), 0, copies.src.nbytes)

    stream = ctypes.c_void_p(device.stream.handle)
    began = lib.cuStreamBeginCapture_v2(stream, cuda_graph.CAPTURE_MODE_THREAD_LOCAL)
    refused = None
    try:
        unsafe()
    except cuda.Error as exc:
        refused = f"{type(exc).__name__}: {exc}"
    graph = ctypes.c_void_p()
    ended = lib.cuStreamEndCapture(stream, ctypes.byref(graph))
    if graph.value:
        lib.cuGraphDestroy(graph)
    copies.enqueue()
    copies.apply()
    device.sync()
    after = copies.equal()
    summary.add("failed capture", began == 0 and refused is not None and ended != 0 and not graph.value and after,
                f"memset during capture: {refused or 'not refused'}; cuStreamEndCapture: {error_name(lib, ended)}; "
                f"no graph: {not graph.value}; the stream after: {'works' if after else 'BROKEN'}")
    try:
        cuda_graph.runtime()
        cudart = "libcudart.so.12's last error cleared"
    except OSError:  # TensorRT 10.3's CUDA runtime is 12; a GPU machine with another CUDA has none such
        cudart = "no libcudart.so.12 here: logged, and the cleanup went on"
    try:
        cuda_graph.Graph(device.stream.handle, unsafe).close()
        raised = "nothing"
    except (cuda_graph.CudaError, cuda.Error) as exc:
        raised = type(exc).__name__
    retried = cuda_graph.Graph(device.stream.handle, copies.enqueue)
    retried.launch()
    retried.close()
    copies.apply()
    device.sync()
    summary.add("Graph after a failed capture", raised != "nothing" and copies.equal(),
                f"Graph over the memset raised {raised} and cleaned up ({cudart}); the next capture replays right")


def error_name(lib, code: int) -> str:
    if code == 0:
        return "CUDA_SUCCESS"
    name = ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    return f"{(name.value or b'?').decode()} ({code})"


def checks(summary: Summary, rounds: int = 200) -> None:
    """Every row on device 0 (the caller made pycuda importable)."""
    import pycuda

    from edged.backends.cuda_device import CudaDevice

    device = CudaDevice()
    try:
        major, minor = device.device.compute_capability()
        summary.add("device", True, f"{device.device.name()}, compute capability {major}.{minor}, "
                    f"pycuda {getattr(pycuda, 'VERSION_TEXT', '?')}")
        if check_kernels(device, summary):
            rng = np.random.default_rng(0)
            check_append(device, summary, rng)
            check_copies(device, summary, rng)
            check_fresh_memory(device, summary)
            check_graph(device, summary, rng, rounds)
            check_failed_capture(device, summary, rng)
    finally:
        device.sync()
        device.release_cuda()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200, help="round-trips timed for the CUDA graph row")
    args = p.parse_args()
    summary = Summary()
    checks(summary, args.rounds)
    return summary.print()


if __name__ == "__main__":
    sys.exit(main())
