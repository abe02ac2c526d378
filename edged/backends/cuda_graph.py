"""CUDA graphs through the CUDA driver API: capture what one bound plan enqueues, replay it per step.

pycuda has no stream capture, so this calls libcuda (always present where CUDA runs) through
ctypes: `cuStreamBeginCapture_v2` on the backend's stream, the plan's enqueue, `cuStreamEndCapture`,
`cuGraphInstantiateWithFlags`; a step is then one `cuGraphLaunch` instead of one launch per kernel.
A captured graph holds the addresses and shapes that were bound when it was captured, so it is made
once per bound plan, whose buffers never move. Every driver call's result is checked and a failure
names the call and the CUDA error.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache

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
                       ("cuGraphExecDestroy", [handle]),
                       ("cuGraphDestroy", [handle]),
                       ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


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
        graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
        check(lib, "cuStreamBeginCapture", lib.cuStreamBeginCapture_v2(self.stream, CAPTURE_MODE_THREAD_LOCAL))
        try:
            enqueue()
        finally:  # a capture is always ended, also when the enqueue failed
            ended = lib.cuStreamEndCapture(self.stream, ctypes.byref(graph))
        check(lib, "cuStreamEndCapture", ended)
        self.graph = graph
        check(lib, "cuGraphInstantiate", lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), graph, 0))

    def launch(self) -> None:
        check(self.lib, "cuGraphLaunch", self.lib.cuGraphLaunch(self.exec, self.stream))

    def close(self) -> None:
        """Destroy the executable graph and the graph; idempotent."""
        if self.exec.value:
            check(self.lib, "cuGraphExecDestroy", self.lib.cuGraphExecDestroy(self.exec))
            self.exec = ctypes.c_void_p()
        if self.graph.value:
            check(self.lib, "cuGraphDestroy", self.lib.cuGraphDestroy(self.graph))
            self.graph = ctypes.c_void_p()
