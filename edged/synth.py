"""Offline synthesis: the talker and vocoder stages run to completion over a list of requests.

Requests share the cohort: up to max_batch run at once, a finished member's slot takes the next
request at the next frame boundary. This is what `edged synth` and the benchmarks drive; the daemon
runs the same stages under its scheduler.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend
from edged.request import SpeechRequest
from edged.talker.port import CodecPort
from edged.talker.stage import Member, Outcome, TalkerStage
from edged.vocoder.stage import VocoderStage


class RequestError(ValueError):
    """A request refused at admission; the message says why."""


@dataclass
class SynthResult:
    id: str | int
    frames: np.ndarray  # [N, G] int64, the eos frame excluded
    pcm: np.ndarray  # [N * samples_per_frame] float32
    reason: str  # eos | length
    report: dict = field(default_factory=dict)


class Synthesizer:
    def __init__(self, artifact: Artifact, backend: Backend, *, chunk_frames: int = 4, first_chunk_frames: int = 1):
        self.artifact = artifact
        a = artifact
        self.port = CodecPort(a.max_batch, a.max_seq, a.dims.code_groups)
        self.pcm = np.zeros((a.max_batch, a.max_seq * a.samples_per_frame), dtype=np.float32)
        self.talker = TalkerStage(a, backend, a.tables(), self.port)
        self.vocoder = VocoderStage(a, backend, self.port, self._on_pcm, chunk_frames=chunk_frames,
                                    first_chunk_frames=first_chunk_frames)
        self.claimed = {**self.talker.preallocate(), **self.vocoder.preallocate(), "pcm_out": self.pcm.nbytes}

    def _on_pcm(self, slot: int, first: int, samples: np.ndarray) -> None:
        self.pcm[slot, first:first + samples.shape[0]] = samples

    def synthesize(self, requests: list[SpeechRequest]) -> list[SynthResult]:
        """Run every request to its end; raises RequestError naming the first refused request."""
        for r in requests:
            ok, reason = self.talker.admit(r)
            if not ok:
                raise RequestError(f"request {r.id!r}: {reason}")
        queue = deque(requests)
        free = list(range(self.artifact.max_batch - 1, -1, -1))
        active: list[Member] = []
        results: dict[str | int, SynthResult] = {}
        started: dict[str | int, float] = {}
        while queue or active:
            while queue and free:
                r = queue.popleft()
                started[r.id] = time.perf_counter()
                active.append(self.talker.prepare(r, free.pop()))
                self.vocoder.prepare(active[-1].slot)
            self.talker.step_cohort(active)
            self.vocoder.step_cohort([m.slot for m in active])
            for m in [m for m in active if m.outcome is not Outcome.RUNNING]:
                self.talker.finish(m, m.outcome.value)
                self.vocoder.finish(m.slot)  # the port is closed: decode the tail window
                results[m.request.id] = self._result(m, started[m.request.id])
                active.remove(m)
                free.append(m.slot)
        return [results[r.id] for r in requests]

    def _result(self, m: Member, started: float) -> SynthResult:
        spf = self.artifact.samples_per_frame
        frames = self.port.frames(m.slot).copy()
        pcm = self.pcm[m.slot, : m.frames * spf].copy()
        wall = time.perf_counter() - started
        audio_s = m.frames * spf / self.artifact.sample_rate
        report = {
            "frames": m.frames, "audio_ms": round(audio_s * 1e3, 1), "reason": m.reason,
            "wall_ms": round(wall * 1e3, 3), "rtf": round(wall / audio_s, 4) if audio_s else None,
            "first_frame_ms": round((m.first_frame_at - started) * 1e3, 3) if m.first_frame_at else None,
            "stages": [self.talker.diagnostics(m), self.vocoder.diagnostics(m.slot)],
        }
        return SynthResult(m.request.id, frames, pcm, m.reason or m.outcome.value, report)
