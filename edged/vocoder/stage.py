"""The vocoder stage: walks the codec port with its own cursor per member, decoding windows.

Each window decodes up to `chunk_frames` new frames behind up to `left_context` frames already
decoded; the context's samples are dropped. The decoder is causal, so more context brings the
streamed PCM closer to a whole-utterance decode (docs/artifact.md states the measured error).
One plan per window length is bound at boot, so a window is a copy, a run and a copy.
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
                 *, chunk_frames: int = 4, first_chunk_frames: int = 1, left_context: int = 72):
        if chunk_frames < 1 or first_chunk_frames < 1 or left_context < 0:
            raise ValueError("chunk_frames and first_chunk_frames must be >= 1, left_context >= 0")
        self.artifact = artifact
        self.backend = backend
        self.port = port
        self.sink = sink
        self.chunk = chunk_frames
        self.first_chunk = first_chunk_frames
        self.context = left_context
        self.engine = backend.load(artifact.files["vocoder"])
        self.cursor = np.zeros(artifact.max_batch, dtype=np.int64)
        self.busy_ms = np.zeros(artifact.max_batch)

    def preallocate(self) -> dict[str, int]:
        g, spf = self.artifact.dims.code_groups, self.artifact.samples_per_frame
        self.max_window = self.context + max(self.chunk, self.first_chunk)
        self.window_codes = self.backend.empty((g * self.max_window,), np.int64)
        self.window_pcm = self.backend.empty((self.max_window * spf,), np.float32)
        self.codes_views = [self.window_codes[: g * f].reshape(1, g, f) for f in range(1, self.max_window + 1)]
        self.plans: list[Plan] = [
            self.engine.plan({"codes": self.codes_views[f - 1], "pcm": self.window_pcm[: f * spf].reshape(1, f * spf)})
            for f in range(1, self.max_window + 1)
        ]
        return {"vocoder_window": self.window_codes.nbytes + self.window_pcm.nbytes}

    def open(self, slot: int) -> None:
        self.cursor[slot] = 0
        self.busy_ms[slot] = 0.0

    def step(self, slots: list[int]) -> None:
        """Decode every window that is ready for these slots (full chunks, or the tail once closed)."""
        for slot in slots:
            while self._window(slot):
                pass

    def pending(self, slot: int) -> bool:
        return self.cursor[slot] < self.port.published[slot]

    def _window(self, slot: int) -> bool:
        cursor, available = int(self.cursor[slot]), int(self.port.published[slot])
        want = self.first_chunk if cursor == 0 else self.chunk
        new = min(want, available - cursor)
        if new <= 0 or (new < want and not self.port.closed[slot]):
            return False
        t0 = time.perf_counter()
        context = min(self.context, cursor)
        frames = context + new
        np.copyto(self.codes_views[frames - 1][0], self.port.codes[slot, cursor - context: cursor + new].T)
        self.plans[frames - 1].run()
        spf = self.artifact.samples_per_frame
        self.sink(slot, cursor * spf, self.window_pcm[context * spf: frames * spf])
        self.cursor[slot] = cursor + new
        self.busy_ms[slot] += (time.perf_counter() - t0) * 1e3
        return True

    def diagnostics(self, slot: int) -> dict:
        return {"stage": "vocoder", "frames": int(self.cursor[slot]), "vocoder_ms": round(float(self.busy_ms[slot]), 3),
                "left_context": self.context, "chunk_frames": self.chunk}
