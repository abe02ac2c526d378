"""The vocoder stage: walks the codec port with its own cursor per member, decoding new frames.

The vocoder graph is stateful (docs/artifact.md): each call decodes only the new frames and carries
the decoder's state (attention history, causal-conv tails) to the next call, so streamed PCM equals
a whole-utterance decode. Each member slot owns two state buffers that the plans ping-pong between
(one is read while the other is written; device buffers, zeroed by the backend, never touched by the
host), two PCM buffers that alternate the same way, and its own codes and start buffers, each an
allocation of its own (so every bound address is 256-byte aligned, whatever the state's size); one
plan per (slot, side, window length) is bound at boot, so a window is a copy and a run.

A window is `first_chunk_frames` new frames at the start of a stream, then `chunk_frames`, and the
rest once the talker has closed the slot. A stream's first `lead_samples` (artifact.json; Qwen3-Omni's
code2wav: 555) are not audio: the first window leaves them out and every later one is numbered
after them.

Decoding a window is two calls, so that the second can run on another thread (`VocoderWorker`):
`next_window(slot)` is the bookkeeping (is a window ready, its codes copied out of the port, the
cursor moved past it) and `fill(window)` runs its plan. A window's samples are a view of the PCM
buffer of its side: it stays valid until the slot's next window is decoded into that buffer, two
windows later (`decode` does both calls at once, for callers on one thread).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend, Plan
from edged.core.port import CodecPort
from edged.vocoder.form import choose_vocoder


@dataclass(eq=False)
class Window:
    """The newest PCM of one slot: samples [first_sample, first_sample + len(samples)) of its stream."""

    slot: int
    first_sample: int = 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    first: bool = False
    """The stream's first window."""
    last: bool = False
    """The stream's last window: the talker has closed the slot and this window reaches its end."""
    plan: Plan | None = field(default=None, repr=False)
    """The bound run that decodes it into `samples` (`VocoderStage.fill`)."""


class VocoderStage:
    def __init__(self, artifact: Artifact, backend: Backend, port: CodecPort,
                 *, chunk_frames: int = 4, first_chunk_frames: int = 1):
        if chunk_frames < 1 or first_chunk_frames < 1:
            raise ValueError("chunk_frames and first_chunk_frames must be >= 1")
        self.artifact = artifact
        self.backend = backend
        self.port = port
        self.chunk = chunk_frames
        self.first_chunk = first_chunk_frames
        self.window_frames = max(chunk_frames, first_chunk_frames)
        self.form = choose_vocoder(artifact, backend.name)
        self.engine = backend.load(artifact.file(self.form.role))
        self.state_specs = artifact.graphs[self.form.role].state
        self.cursor = np.zeros(artifact.max_batch, dtype=np.int64)
        self.offset = np.zeros(artifact.max_batch, dtype=np.int64)  # primed frames before the stream's own
        self.side = np.zeros(artifact.max_batch, dtype=np.int64)  # which state (and PCM) buffer the next window reads
        self.busy_ms = np.zeros(artifact.max_batch)
        self.windows = [[Window(slot) for _ in (0, 1)] for slot in range(artifact.max_batch)]  # [slot][side]

    def preallocate(self) -> dict[str, int]:
        a, dt = self.artifact, self.engine.dtype
        b, g, spf, w = a.max_batch, a.dims.code_groups, a.samples_per_frame, self.window_frames
        e = self.backend.empty
        self.codes = [e((g * w,), dt("codes")) for _ in range(b)]
        self.pcm = [e((1, w * spf), dt("pcm")) for _ in range(2 * b)]  # [side * b + slot]
        self.start = [e((1,), dt("start")) for _ in range(b)]
        # [side][k][slot] -> [1, ...]
        dev = self.backend.device_empty  # only the engine reads the state: device memory on TensorRT
        self.states = [[[dev((1, *s.shape), dt(s.input)) for _ in range(b)] for s in self.state_specs] for _ in range(2)]
        self.plans: dict[tuple[int, int, int], Plan] = {
            (slot, side, f): self._plan(slot, side, f) for slot in range(b) for side in (0, 1) for f in range(1, w + 1)}
        lead = a.lead_samples  # a stream's first window leaves out the samples that are not audio
        self.views = {(slot, side, f, first): self._pcm(slot, side)[0, (lead if first else 0): f * spf]
                      for slot in range(b) for side in (0, 1) for f in range(1, w + 1) for first in (False, True)}
        self.primed_stage = [self.backend.empty((1, *s.shape), dt(s.input)) for s in self.state_specs]
        state_bytes = sum(x.nbytes for side in self.states for state in side for x in state)
        return {"vocoder_state": state_bytes, "vocoder_primed_stage": sum(x.nbytes for x in self.primed_stage),
                "vocoder_window": sum(x.nbytes for x in (*self.codes, *self.pcm, *self.start))}

    def _pcm(self, slot: int, side: int) -> np.ndarray:
        return self.pcm[side * self.artifact.max_batch + slot]

    def _plan(self, slot: int, side: int, frames: int) -> Plan:
        g, spf = self.artifact.dims.code_groups, self.artifact.samples_per_frame
        binds = {"codes": self.codes[slot][: g * frames].reshape(1, g, frames), "start": self.start[slot],
                 "pcm": self._pcm(slot, side)[:, : frames * spf]}
        for k, spec in enumerate(self.state_specs):
            binds[spec.input] = self.states[side][k][slot]
            binds[spec.output] = self.states[1 - side][k][slot]
        return self.engine.plan(binds, label=f"window of {frames} frame(s), slot {slot}, side {side}")

    # ---------------------------------------------------------------------------------- stage contract

    def prepare(self, slot: int, prime: np.ndarray | None = None,
                primed: tuple[np.ndarray, ...] | None = None) -> None:
        """A fresh stream in `slot`: zero state, cursor at frame 0. `prime` [T, G]: frames decoded
        first and not heard (a voice cloned in context: the reference's frames, as the reference
        decodes them before the reply's and cuts their samples off); `primed`: the state after
        them, when the clone encoder has it (copied in, instead of decoding them here). No window of
        the slot may be decoding meanwhile."""
        self.cursor[slot] = 0
        self.side[slot] = 0
        self.offset[slot] = 0
        self.busy_ms[slot] = 0.0
        if prime is not None and primed is not None:
            for state, stage, value in zip(self.states[0], self.primed_stage, primed, strict=True):
                np.copyto(stage, value)  # into a buffer of this backend, then where the engine reads it
                self.backend.copy(state[slot], stage)
            self.backend.sync()  # the copies have read the stage before the next prepare writes it
            self.offset[slot] = len(prime)
            return
        for state in self.states[0]:
            self.backend.zero(state[slot])
        if prime is not None:
            t0 = time.perf_counter()
            for first in range(0, len(prime), self.window_frames):
                self.plans[self._stage(slot, prime[first:first + self.window_frames], first)].run()
            self.offset[slot] = len(prime)
            self.busy_ms[slot] += (time.perf_counter() - t0) * 1e3

    def next_window(self, slot: int) -> Window | None:
        """The slot's next window when it is ready (a full chunk, or the tail once the slot is closed),
        staged: its codes copied in, the cursor past it. `fill` decodes it."""
        new = self._ready_frames(slot)
        if not new:
            return None
        cursor, available, closed = int(self.cursor[slot]), int(self.port.published[slot]), bool(self.port.closed[slot])
        slot, side, new = self._stage(slot, self.port.codes[slot, cursor: cursor + new], int(self.offset[slot]) + cursor)
        self.cursor[slot] = cursor + new
        window = self.windows[slot][side]
        window.plan, window.first, window.last = self.plans[(slot, side, new)], cursor == 0, closed and cursor + new == available
        window.first_sample = 0 if cursor == 0 else cursor * self.artifact.samples_per_frame - self.artifact.lead_samples
        window.samples = self.views[(slot, side, new, cursor == 0)]
        return window

    def ready(self, slot: int) -> bool:
        """Whether `next_window(slot)` would stage a window."""
        return self._ready_frames(slot) > 0

    def _ready_frames(self, slot: int) -> int:
        """The frames of the slot's next window when it is ready, else 0."""
        cursor, available = int(self.cursor[slot]), int(self.port.published[slot])
        want = self.first_chunk if cursor == 0 else self.chunk
        new = min(want, available - cursor)
        return 0 if new <= 0 or (new < want and not self.port.closed[slot]) else new

    def fill(self, window: Window) -> None:
        """Decode a staged window into its samples (on the thread that runs this stage's engine)."""
        t0 = time.perf_counter()
        window.plan.run()  # type: ignore[union-attr]
        self.busy_ms[window.slot] += (time.perf_counter() - t0) * 1e3

    def decode(self, slot: int) -> Window | None:
        """The slot's next window, staged and decoded, when it is ready."""
        window = self.next_window(slot)
        if window is not None:
            self.fill(window)
        return window

    def _stage(self, slot: int, frames: np.ndarray, start: int) -> tuple[int, int, int]:
        """frames [n, G], frame `start` of the graph's stream onward, into the slot's codes; the key of
        the plan that decodes them through the slot's state (whose side flips for the next window)."""
        g, new = self.artifact.dims.code_groups, len(frames)
        np.copyto(self.codes[slot][: g * new].reshape(g, new), frames.T)
        self.start[slot][0] = start
        side = int(self.side[slot])
        self.side[slot] = 1 - side
        return slot, side, new

    def reset(self) -> None:
        self.cursor[:] = 0
        self.offset[:] = 0
        self.side[:] = 0

    def diagnostics(self, slot: int) -> dict:
        return {"stage": "vocoder", "frames": int(self.cursor[slot]), "vocoder_ms": round(float(self.busy_ms[slot]), 3),
                "chunk_frames": self.chunk}
