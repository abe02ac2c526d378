"""Offline synthesis: the step core runs a list of requests to their ends.

Requests share the cohort as in the daemon: the same scheduler gives each the lowest free slot at a
frame boundary, and the same core makes one frame per member per step (with `vocoder_threads`, the
vocoder on a thread of its own: `close()` stops it). This is what `edged synth` and the benchmarks'
"edged" path drive.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend
from edged.core import Core, Member
from edged.request import SpeechRequest
from edged.scheduler.scheduler import Entry, Scheduler


class RequestError(ValueError):
    """A request refused at admission; the message says why."""


@dataclass
class SynthResult:
    id: str | int
    frames: np.ndarray  # [N, G] int64, the eos frame excluded
    pcm: np.ndarray  # [N * samples_per_frame - lead_samples] float32
    reason: str  # eos | length
    report: dict = field(default_factory=dict)


@dataclass
class _Job:
    request: SpeechRequest
    started: float
    member: Member | None = None
    first_audio_at: float | None = None


class Synthesizer:
    def __init__(self, artifact: Artifact, backend: Backend, *, vocoder_threads: int = 0, chunk_frames: int = 4,
                 first_chunk_frames: int = 1, graph_window: int = 0):
        a = self.artifact = artifact
        self.core = Core(a, backend, vocoder_threads=vocoder_threads, chunk_frames=chunk_frames,
                         first_chunk_frames=first_chunk_frames, graph_window=graph_window)
        self.pcm = np.zeros((a.max_batch, a.max_seq * a.samples_per_frame), dtype=np.float32)
        self.claimed = {**self.core.preallocate(), "pcm_out": self.pcm.nbytes}

    def synthesize(self, requests: list[SpeechRequest]) -> list[SynthResult]:
        """Run every request to its end; raises RequestError naming the first refused request."""
        for r in requests:
            ok, reason = self.core.admit(r)
            if not ok:
                raise RequestError(f"request {r.id!r}: {reason}")
        scheduler = Scheduler(self.artifact.max_batch, queue_limit=len(requests))
        for i, r in enumerate(requests):
            scheduler.submit(Entry(i, _Job(r, 0.0)))
        results: dict[Hashable, SynthResult] = {}
        while scheduler.by_key:
            for entry in scheduler.join():
                job = entry.payload
                job.started = time.perf_counter()
                assert entry.slot is not None
                job.member = self.core.prepare(job.request, entry.slot)
            entries = scheduler.members
            out = self.core.step([e.payload.member for e in entries])
            for window in out.windows:
                samples = window.samples
                self.pcm[window.slot, window.first_sample:window.first_sample + len(samples)] = samples
                job = scheduler.running[window.slot].payload
                job.first_audio_at = job.first_audio_at or time.perf_counter()
            for member in out.finished:
                entry = scheduler.running[member.slot]
                results[entry.key] = self._result(entry.payload)
                scheduler.end(entry, member.outcome.value)
        return [results[i] for i in range(len(requests))]

    def close(self) -> None:
        """Stop the vocoder's thread and release its engines; the backend is the caller's."""
        self.core.close()

    def _result(self, job: _Job) -> SynthResult:
        m = job.member
        assert m is not None
        samples = self.artifact.stream_samples(m.frames)
        wall = time.perf_counter() - job.started
        audio_s = samples / self.artifact.sample_rate
        ms = lambda t: round((t - job.started) * 1e3, 3) if t else None  # noqa: E731
        report = {
            "frames": m.frames, "audio_ms": round(audio_s * 1e3, 1), "reason": m.outcome.value,
            "wall_ms": round(wall * 1e3, 3), "rtf": round(wall / audio_s, 4) if audio_s else None,
            "first_frame_ms": ms(m.first_frame_at), "first_audio_ms": ms(job.first_audio_at),
            "stages": self.core.diagnostics(m),
        }
        return SynthResult(job.request.id, self.core.frames(m).copy(), self.pcm[m.slot, :samples].copy(),
                           m.outcome.value, report)
