"""The Engine interface: named tensors bound once to preallocated buffers, then `run()` per step.

A caller allocates every buffer at boot with `Backend.empty`, then asks each engine for a `Plan`
per shape it will run (one per batch size, one per vocoder window length, ...). A plan binds
every input and output by name to those buffers; the step path only calls `plan.run()`.

ONNX Runtime implements a plan as an IOBinding over host buffers; TensorRT as an execution
context's tensor addresses and input shapes over mapped (zero-copy) pinned buffers. Callers never
see the difference.

Every bound buffer starts on a 256-byte boundary (TensorRT 10 refuses other tensor addresses):
`Backend.empty` returns aligned allocations, and callers bind whole allocations or views whose
offset keeps the alignment (a per-slot row is bound only when its stride is a multiple of 256
bytes; otherwise each slot gets an allocation of its own). `Engine.plan` checks it for every
backend, so a misaligned view fails at boot, named. `Backend.close()` releases engines and buffers
in order (TensorRT: and pops the CUDA context); it is idempotent.

What only the engines read (the KV cache, the vocoder state) is claimed with `device_empty` and
written only through `copy` and `zero`: on TensorRT it is device memory the host cannot touch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ALIGNMENT = 256
"""Bytes every bound tensor address is a multiple of (TensorRT 10's requirement)."""


class EngineError(RuntimeError):
    """An engine that cannot load or bind; the message names the graph and tensor."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # None = dynamic
    dtype: np.dtype


class Plan(ABC):
    """One bound invocation of an engine; `run()` is the only call on the step path."""

    bindings: Mapping[str, np.ndarray]
    """The buffers it is bound to, by tensor name."""

    @abstractmethod
    def run(self) -> None: ...


class Engine(ABC):
    def __init__(self, path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]):
        self.path = path
        self.inputs = {t.name: t for t in inputs}
        self.outputs = {t.name: t for t in outputs}

    @property
    def name(self) -> str:
        return self.path.name

    def dtype(self, tensor: str) -> np.dtype:
        """The element type of an input or output: buffers take their dtype from the graph."""
        spec = self.inputs.get(tensor) or self.outputs.get(tensor)
        if spec is None:
            raise EngineError(f"{self.name}: has no tensor {tensor}")
        return spec.dtype

    def plan(self, bindings: Mapping[str, np.ndarray], *, repeated: bool = True) -> Plan:
        """Bind every input and output of the graph to a buffer; checked once, here. `repeated`: the
        plan runs again and again (a step); False for a plan made for one run (a prefill of one
        length), which a backend does not prepare further (TensorRT: no CUDA graph)."""
        wanted = set(self.inputs) | set(self.outputs)
        missing = sorted(wanted - set(bindings))
        extra = sorted(set(bindings) - wanted)
        if missing or extra:
            raise EngineError(f"{self.name}: bindings missing {missing} / unknown {extra}")
        for name, buf in bindings.items():
            spec = self.inputs.get(name) or self.outputs[name]
            self._check(spec, buf)
        plan = self._plan(bindings, repeated)
        plan.bindings = dict(bindings)
        return plan

    def _check(self, spec: TensorSpec, buf: np.ndarray) -> None:
        if buf.dtype != spec.dtype:
            raise EngineError(f"{self.name}: tensor {spec.name} is {spec.dtype}, buffer is {buf.dtype}")
        if not buf.flags.c_contiguous:
            raise EngineError(f"{self.name}: buffer for {spec.name} is not contiguous")
        if buf.ctypes.data % ALIGNMENT:
            raise EngineError(f"{self.name}: buffer for {spec.name} starts at an address that is not a multiple of "
                              f"{ALIGNMENT} bytes")
        if len(buf.shape) != len(spec.shape) or any(
                want is not None and want != got for want, got in zip(spec.shape, buf.shape)):
            raise EngineError(f"{self.name}: tensor {spec.name} has shape {_fmt(spec.shape)}, buffer has {list(buf.shape)}")

    @abstractmethod
    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool) -> Plan: ...


class Backend(ABC):
    name: str

    @abstractmethod
    def load(self, path: Path) -> Engine: ...

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A zeroed buffer that this backend's engines can bind (host, pinned or mapped), starting on
        an ALIGNMENT boundary."""

    def device_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A zeroed buffer that only engines, `copy` and `zero` touch (the KV cache, the vocoder
        state): device memory where the backend has one (TensorRT), which the host must never read or
        write directly. Here: host memory, as `empty`."""
        return self.empty(shape, dtype)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """`dst[...] = src` in order with the engines' work, for any buffers of this backend (device
        ones included). Both must be the same shape and a 2-D copy: rows of contiguous bytes, evenly
        strided on each side (a K/V row into the cache is one)."""
        copy_rows(dst, src)  # the same contract on every backend
        np.copyto(dst, src)

    def zero(self, dst: np.ndarray) -> None:
        """Zero a whole (contiguous) buffer of this backend, in order with the engines' work."""
        dst.fill(0)

    @abstractmethod
    def close(self) -> None:
        """Release every engine and buffer, in order; idempotent. Nothing may run afterwards."""


def aligned_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed host array whose data starts on an ALIGNMENT boundary."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(size + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset:offset + size].view(dtype).reshape(shape)


def copy_rows(dst: np.ndarray, src: np.ndarray) -> tuple[int, int, int, int]:
    """(width in bytes, height, dst pitch, src pitch) of `dst[...] = src` as rows of contiguous bytes:
    the innermost dimensions contiguous in both make a row, the rest must be one evenly strided run
    of rows in each. A copy that is not 2-D is an error."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise EngineError(f"copy: {src.dtype}{list(src.shape)} into {dst.dtype}{list(dst.shape)}")
    dims = [(n, ds, ss) for n, ds, ss in zip(dst.shape, dst.strides, src.strides) if n != 1]
    width = dst.itemsize
    while dims and dims[-1][1] == width and dims[-1][2] == width:
        width *= dims.pop()[0]
    if not dims:
        return width, 1, width, width
    height, dst_pitch, src_pitch = dims.pop()
    while dims and dims[-1][1] == dst_pitch * height and dims[-1][2] == src_pitch * height:
        height *= dims.pop()[0]
    if dims:
        raise EngineError(f"copy: {list(dst.shape)} with strides {dst.strides} / {src.strides} is not a 2-D copy")
    return width, height, dst_pitch, src_pitch


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
