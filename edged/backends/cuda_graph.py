"""CUDA graphs through the CUDA driver API: capture what one bound plan enqueues, replay it per step.

pycuda has no stream capture, so this calls libcuda (always present where CUDA runs) through
ctypes: `cuStreamBeginCapture_v2` on the backend's stream (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), the
plan's enqueue, `cuStreamEndCapture`, `cuGraphInstantiateWithFlags`; a step is then one
`cuGraphLaunch` instead of one launch per kernel. The executable graph is uploaded to the device
when it is instantiated (`cuGraphUpload`, cuda.h: "Uploads hGraphExec to the device in hStream
without executing it"), so no step pays for it. A captured graph holds the addresses and shapes
that were bound when it was captured, so it is made once per bound plan, whose buffers never move.
Only the executable graph is kept (the captured one is destroyed once instantiated, as trtexec does).

A capture that fails is cleaned up the way trtexec's endCaptureOnError does (samples/common/
sampleDevice.h, TensorRT v10.3.0): the capture is always ended, a graph it returned is destroyed,
and the process's libcudart last error is cleared with `cudaGetLastError()`; a graph whose
instantiation failed is destroyed too. That clears TensorRT's own error only where libnvinfer shares
this libcudart: TensorRT links its CUDA runtime statically, and its runtime's last error is reported
(and so cleared) by TensorRT's next call, which is why the caller enqueues once more, and retries
once, before it settles on enqueuing the plan per run (`tensorrt.py`). A libcudart that cannot be
loaded is logged and the cleanup goes on: it never aborts a boot that can fall back to enqueues.
Every driver call's result is checked and a failure names the call and the CUDA error.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

log = logging.getLogger("edged.cuda_graph")
CAPTURE_MODE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' CUDA calls are not affected


class CudaError(RuntimeError):
    """A CUDA driver call that failed; the message names the call and the error."""


@cache
def driver():
    """libcuda, with the signatures of the calls used here (tests put a double in its place)."""
    lib = ctypes.CDLL("libcuda.so.1")
    handle, out = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    for name, args in (("cuStreamBeginCapture_v2", [handle, ctypes.c_int]),
                       ("cuStreamEndCapture", [handle, out]),
                       ("cuGraphInstantiateWithFlags", [out, handle, ctypes.c_ulonglong]),
                       ("cuGraphLaunch", [handle, handle]),
                       ("cuGraphUpload", [handle, handle]),
                       ("cuGraphExecDestroy", [handle]),
                       ("cuGraphDestroy", [handle]),
                       ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


@cache
def runtime():
    """The process's libcudart, TensorRT 10.3's CUDA 12 one (tests put a double in its place)."""
    lib = ctypes.CDLL("libcudart.so.12")
    lib.cudaGetLastError.argtypes, lib.cudaGetLastError.restype = [], ctypes.c_int
    return lib


def clear_runtime_error() -> None:
    """`cudaGetLastError()` on the process's libcudart, or a log line saying there is none to load."""
    try:
        lib = runtime()
    except OSError as exc:  # the capture failed already; the caller falls back to enqueues
        log.warning("libcudart not loaded to clear a failed capture's error (%s)", exc)
        return
    lib.cudaGetLastError()


def check(lib, call: str, result: int) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        raise CudaError(f"{call} failed: {(name.value or b'CUDA error').decode()} ({result})")


class Graph:
    """The work `enqueue` puts on the stream, captured once and launched by `launch()`."""

    def __init__(self, stream: int, enqueue: Callable[[], None]):
        self.lib = lib = driver()
        self.stream = ctypes.c_void_p(stream)
        self.exec = ctypes.c_void_p()
        graph = ctypes.c_void_p()
        check(lib, "cuStreamBeginCapture", lib.cuStreamBeginCapture_v2(self.stream, CAPTURE_MODE_THREAD_LOCAL))
        try:
            enqueue()
        except BaseException:
            lib.cuStreamEndCapture(self.stream, ctypes.byref(graph))  # always ended, whatever it returns
            self._discard(graph)
            raise
        ended = lib.cuStreamEndCapture(self.stream, ctypes.byref(graph))
        if ended != 0:
            self._discard(graph)
            check(lib, "cuStreamEndCapture", ended)
        instantiated = lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), graph, 0)
        if instantiated != 0:
            self._discard(graph)
            check(lib, "cuGraphInstantiate", instantiated)
        check(lib, "cuGraphDestroy", lib.cuGraphDestroy(graph))  # the executable graph is all a launch needs
        check(lib, "cuGraphUpload", lib.cuGraphUpload(self.exec, self.stream))  # to the device now, not at a step

    def _discard(self, graph: ctypes.c_void_p) -> None:
        """After a failed capture: destroy what it returned and clear the runtime's last error."""
        try:
            if graph.value:
                check(self.lib, "cuGraphDestroy", self.lib.cuGraphDestroy(graph))
        finally:
            clear_runtime_error()

    def launch(self) -> None:
        check(self.lib, "cuGraphLaunch", self.lib.cuGraphLaunch(self.exec, self.stream))

    def close(self) -> None:
        """Destroy the executable graph; idempotent."""
        if self.exec.value:
            check(self.lib, "cuGraphExecDestroy", self.lib.cuGraphExecDestroy(self.exec))
            self.exec = ctypes.c_void_p()
