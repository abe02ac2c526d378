"""One timed run of the offline cohort: what `edged bench` prints and the repository's benchmarks
(scripts/bench/synth.py) read, on whatever machine the artifact runs.

A run is `Synthesizer.synthesize` over requests that start together, so every member is in each of
the cohort's steps: wall time, frames, when the first member's first frame and first audio came,
and per step (one frame of each member) the talker and code predictor's time and the vocoder's
windows of every member, whichever thread decoded them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

TEXTS = (
    "Hello world, this is edged speaking.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech on a small device, one frame at a time.",
    "Please keep the door closed when the heating is on.",
)
"""The benchmark's texts, one per member (a cohort of more members repeats them)."""


@dataclass
class Timed:
    wall_s: float
    frames: int
    """Frames of all members together."""
    steps: int
    first_frame_s: float | None
    first_audio_s: float | None
    generation_s: float
    """Per step: the talker and the code predictor."""
    vocoder_s: float
    """Per step: every member's vocoder windows."""

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.wall_s

    def rtf(self, frame_s: float) -> float:
        """Wall time over one member's audio (the members start and end together)."""
        return self.wall_s / (self.steps * frame_s)


def requests(batch: int, frames: int, voice: str | None = None, language: str | None = None,
             verify: int = 0) -> list[SpeechRequest]:
    """`batch` greedy requests of at most `frames` frames (`verify`: the code predictor's verify window)."""
    sampling = Sampling.greedy().with_overrides({"cp_spec_verify_size": verify})
    return [SpeechRequest(id=f"r{i}", text=TEXTS[i % len(TEXTS)], voice=voice, language=language,
                          sampling=sampling, max_frames=frames) for i in range(batch)]


def timed(synth: Synthesizer, reqs: list[SpeechRequest]) -> tuple[Timed, list]:
    """One run of `reqs`, started together, and its results."""
    t0 = time.perf_counter()
    results = synth.synthesize(reqs)
    wall = time.perf_counter() - t0
    first = results[0].report  # the first request starts with the run
    steps = max(r.frames.shape[0] for r in results)
    talker = first["stages"][0]  # every member of a cohort that starts together is in each of its steps
    vocoder_ms = sum(r.report["stages"][1]["vocoder_ms"] for r in results)
    ms = lambda v: v / 1e3 if v is not None else None  # noqa: E731
    return Timed(wall, sum(r.frames.shape[0] for r in results), steps, ms(first["first_frame_ms"]),
                 ms(first["first_audio_ms"]), talker["step_ms"] / talker["frames"] / 1e3,
                 vocoder_ms / steps / 1e3), results
