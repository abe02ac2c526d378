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

What only the engines read (the KV cache, the vocoder state, the code predictor's heads) is claimed
with `device_empty` (or `device_from`, filled once at boot) and written only through `copy`, `zero`
and appends: on TensorRT it is device memory the host cannot touch. A plan may carry an `Append`:
rows of its outputs written into a cache at each member's position as part of the run (on TensorRT
one kernel launch, inside the step's CUDA graph).

Work is asynchronous where the backend is (TensorRT: one stream): `Plan.run()` returns with its
outputs ready, but `copy` and `zero` are only ordered with the engines' work; the host reads or
reuses their buffers after `sync()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
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


@dataclass(frozen=True)
class Rows:
    """A plan's new rows [n, ..., T, ...] and the cache [B, ..., S, ...] they go into, along `axis`."""

    cache: np.ndarray
    rows: np.ndarray
    axis: int


@dataclass(frozen=True)
class Append:
    """After the engine runs: for each member m < n with active[m] (every member without `active`),
    cache[slots[m] (m without `slots`), ..., positions[m] : positions[m] + T, ...] = rows[m] for every
    `Rows`. positions, slots and active are the backend's buffers, read when the plan runs."""

    rows: tuple[Rows, ...]
    positions: np.ndarray
    slots: np.ndarray | None = None
    active: np.ndarray | None = None

    def check(self) -> None:
        """Every pair is a block of evenly strided runs on both sides (what the kernel copies)."""
        n = self.rows[0].rows.shape[0]
        for r in self.rows:
            t = r.rows.shape[r.axis]
            others = [(c, w) for i, (c, w) in enumerate(zip(r.cache.shape, r.rows.shape)) if i not in (0, r.axis)]
            if r.rows.shape[0] != n or r.cache.dtype != r.rows.dtype or r.cache.ndim != r.rows.ndim or \
                    any(c != w for c, w in others):
                raise EngineError(f"append: rows {r.rows.dtype}{list(r.rows.shape)} do not fit cache "
                                  f"{r.cache.dtype}{list(r.cache.shape)} along axis {r.axis}")
            copy_rows(block(r.cache[0], r.axis - 1, t), r.rows[0])
        if self.positions.shape[0] < n or (self.active is not None and self.active.shape[0] < n) or \
                (self.slots is not None and self.slots.shape[0] < n):
            raise EngineError(f"append: positions, slots and active need a value for each of the {n} members")

    def apply(self) -> None:
        """The append on host memory (what a backend without device memory does)."""
        n = self.rows[0].rows.shape[0]
        for m in range(n):
            if self.active is not None and not self.active[m]:
                continue
            slot, position = m if self.slots is None else int(self.slots[m]), int(self.positions[m])
            for r in self.rows:
                block(r.cache[slot], r.axis - 1, r.rows.shape[r.axis], position)[...] = r.rows[m]


class Plan(ABC):
    """One bound invocation of an engine; `run()` is the only call on the step path."""

    bindings: Mapping[str, np.ndarray]
    """The buffers it is bound to, by tensor name."""
    graphed: bool = False
    """Made for repeated runs worth a CUDA graph (what TensorRT captures at boot)."""

    @abstractmethod
    def run(self) -> None:
        """Run the engine (and its append); its outputs are ready when it returns."""


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

    def plan(self, bindings: Mapping[str, np.ndarray], *, repeated: bool = True, graph: bool = True,
             append: Append | None = None, label: str = "") -> Plan:
        """Bind every input and output of the graph to a buffer; checked once, here. `repeated`: the
        plan runs again and again (a step); False for a plan made for one run (a prefill of one
        length), which a backend does not prepare further (TensorRT: no CUDA graph). `graph`: a
        repeated plan worth a CUDA graph at boot (False: one the configuration rarely runs, enqueued
        instead). `append`: rows of its outputs written into a cache when it runs. `label`: what the
        plan is, for a log line or `status` that names it ("decode of 4 members over 64 slots")."""
        wanted = set(self.inputs) | set(self.outputs)
        missing = sorted(wanted - set(bindings))
        extra = sorted(set(bindings) - wanted)
        if missing or extra:
            raise EngineError(f"{self.name}: bindings missing {missing} / unknown {extra}")
        for name, buf in bindings.items():
            spec = self.inputs.get(name) or self.outputs[name]
            self._check(spec, buf)
        if append is not None:
            append.check()
        plan = self._plan(bindings, repeated and graph, append, f"{self.name} ({label})" if label else self.name)
        plan.bindings = dict(bindings)
        plan.graphed = repeated and graph
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

    def reserve(self, later: Iterable[tuple[Mapping[str, np.ndarray], Append | None]]) -> None:  # noqa: B027
        """At boot, for plans that are bound later (a prefill per prompt length, bound at admission):
        claim now whatever binding one will need, so that binding it after boot claims nothing
        (TensorRT: its profile's shared context and its K/V append's kernel table). `later` is only
        iterated where something is claimed (not on ONNX Runtime)."""

    @abstractmethod
    def _plan(self, bindings: Mapping[str, np.ndarray], repeated: bool, append: Append | None, label: str) -> Plan: ...


def _no_progress() -> None:
    pass


class Backend(ABC):
    name: str
    launches: int = 0
    """Work the host has put on the device: engine enqueues, graph and kernel launches, copies and
    memsets (0 where nothing is launched: ONNX Runtime)."""
    progress: Callable[[], None] = staticmethod(_no_progress)
    """Called as each slow part of the boot is done (TensorRT: an engine deserialized, a plan bound or
    captured); the daemon's BootProgress extends systemd's start timeout from it."""

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

    def device_from(self, array: np.ndarray) -> np.ndarray:
        """A `device_empty` buffer holding a copy of `array`, made once at boot (a table only the
        engines read)."""
        buf = self.device_empty(array.shape, array.dtype)
        np.copyto(buf, array)
        return buf

    def activation_bytes(self) -> int:
        """Device memory the engines' execution contexts claimed for their activations."""
        return 0

    def seal(self) -> None:  # noqa: B027 (a no-op here; TensorRT overrides it)
        """Boot is over: the backend claims no more memory (TensorRT refuses a claim from here on)."""

    def graphs(self) -> int:
        """CUDA graphs the plans bound so far hold."""
        return 0

    def graph_report(self) -> dict:
        """`status.backend.cuda_graphs`: whether plans are captured at all, how many plans were bound for
        repeated runs (`marked`), how many hold a graph, and each capture that failed ({"plan", "why"})."""
        return {"enabled": False, "marked": 0, "captured": 0, "failed": []}

    def sync(self) -> None:  # noqa: B027 (a no-op here; TensorRT overrides it)
        """Wait for every copy and zero enqueued so far (a no-op where work is synchronous)."""

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


def block(member: np.ndarray, axis: int, t: int, start: int = 0) -> np.ndarray:
    """member[..., start:start + t (along axis), ...]: a member's rows of a cache."""
    return member[(slice(None),) * axis + (slice(start, start + t),)]


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
