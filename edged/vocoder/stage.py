"""The vocoder stage: walks the codec port with its own cursor per member, decoding new frames.

The vocoder graph is stateful (docs/artifact.md): each call decodes only the new frames and
carries the decoder's state (attention history, causal-conv tails) to the next call, so streamed
PCM equals a whole-utterance decode. Each member slot owns two state buffers that the plans
ping-pong between (one is read while the other is written); one plan per (slot, side, window
length) is bound at boot, so a window is a copy, a run and a handoff to the sink.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend, Plan
from edged.talker.port import CodecPort

PcmSink = Callable[[int, int, np.ndarray], None]
"""sink(slot, first_sample, samples): samples is a view, valid only during the call."""


class VocoderStage:
    def __init__(self, artifact: Artifact, backend: Backend, port: CodecPort, sink: PcmSink,
                 *, chunk_frames: int = 4, first_chunk_frames: int = 1):
        if chunk_frames < 1 or first_chunk_frames < 1:
            raise ValueError("chunk_frames and first_chunk_frames must be >= 1")
        self.artifact = artifact
        self.backend = backend
        self.port = port
        self.sink = sink
        self.chunk = chunk_frames
        self.first_chunk = first_chunk_frames
        self.engine = backend.load(artifact.files["vocoder"])
        self.cursor = np.zeros(artifact.max_batch, dtype=np.int64)
        self.side = np.zeros(artifact.max_batch, dtype=np.int64)  # which state buffer holds the state
        self.busy_ms = np.zeros(artifact.max_batch)

    def preallocate(self) -> dict[str, int]:
        a = self.artifact
        b, g, spf = a.max_batch, a.dims.code_groups, a.samples_per_frame
        window = max(self.chunk, self.first_chunk)
        e = self.backend.empty
        self.codes = e((g * window,), np.int64)
        self.pcm = e((window * spf,), np.float32)
        self.start = e((b,), np.int64)
        specs = a.vocoder_state
        self.states = [[e((b, *s.shape), np.float32) for s in specs] for _ in range(2)]  # [side][k] -> [B, ...]
        self.plans: dict[tuple[int, int, int], Plan] = {
            (slot, side, f): self._plan(slot, side, f)
            for slot in range(b) for side in (0, 1) for f in range(1, window + 1)
        }
        state_bytes = sum(x.nbytes for side in self.states for x in side)
        return {"vocoder_state": state_bytes, "vocoder_window": self.codes.nbytes + self.pcm.nbytes}

    def _plan(self, slot: int, side: int, frames: int) -> Plan:
        g, spf = self.artifact.dims.code_groups, self.artifact.samples_per_frame
        row = slice(slot, slot + 1)
        binds = {"codes": self.codes[: g * frames].reshape(1, g, frames), "start": self.start[row],
                 "pcm": self.pcm[: frames * spf].reshape(1, frames * spf)}
        for k, spec in enumerate(self.artifact.vocoder_state):
            binds[spec.input] = self.states[side][k][row]
            binds[spec.output] = self.states[1 - side][k][row]
        return self.engine.plan(binds)

    # ---------------------------------------------------------------------------------- stage contract

    def admit(self, request) -> tuple[bool, str]:
        return True, ""

    def prepare(self, slot: int) -> None:
        """A fresh stream in `slot`: zero state, cursor at frame 0."""
        self.cursor[slot] = 0
        self.side[slot] = 0
        self.busy_ms[slot] = 0.0
        for state in self.states[0]:
            state[slot] = 0.0

    def step_cohort(self, slots: list[int]) -> None:
        """Decode every window that is ready for these slots (full chunks, or the tail once closed)."""
        for slot in slots:
            while self._window(slot):
                pass

    def finish(self, slot: int) -> None:
        """Drain what the talker published before it closed the slot."""
        self.step_cohort([slot])

    def reset(self) -> None:
        self.cursor[:] = 0
        self.side[:] = 0

    def diagnostics(self, slot: int) -> dict:
        return {"stage": "vocoder", "frames": int(self.cursor[slot]), "vocoder_ms": round(float(self.busy_ms[slot]), 3),
                "chunk_frames": self.chunk}

    # ---------------------------------------------------------------------------------- one window

    def _window(self, slot: int) -> bool:
        cursor, available = int(self.cursor[slot]), int(self.port.published[slot])
        want = self.first_chunk if cursor == 0 else self.chunk
        new = min(want, available - cursor)
        if new <= 0 or (new < want and not self.port.closed[slot]):
            return False
        t0 = time.perf_counter()
        g, spf = self.artifact.dims.code_groups, self.artifact.samples_per_frame
        np.copyto(self.codes[: g * new].reshape(g, new), self.port.codes[slot, cursor: cursor + new].T)
        self.start[slot] = cursor
        side = int(self.side[slot])
        self.plans[(slot, side, new)].run()
        self.side[slot] = 1 - side
        self.sink(slot, cursor * spf, self.pcm[: new * spf])
        self.cursor[slot] = cursor + new
        self.busy_ms[slot] += (time.perf_counter() - t0) * 1e3
        return True
