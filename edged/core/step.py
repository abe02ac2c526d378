"""One step core for everything that generates speech (nano-vllm's `step()` returns its outputs).

`Core.step(members)` makes exactly one codec frame for each member it is given and returns what
that step made: the members that made a frame, the vocoder windows that became ready, and the
members that finished (eos, or their frame limit; their last window is already in `windows`).
Members that are not given (paused: waiting for room in their speaker buffer, or for text) come out
of the step unchanged, whatever slot they hold. The caller decides where the outputs go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend
from edged.core.port import CodecPort
from edged.families import get_family
from edged.request import Sampling, SpeechRequest
from edged.talker.stage import Member, Outcome, TalkerStage
from edged.talker.text import Streamed, TextStream
from edged.vocoder.stage import VocoderStage, Window


@dataclass
class StepOutput:
    """What one step made; the lists are reused by the next step."""

    frames: list[Member] = field(default_factory=list)
    """Members that made a frame (their newest frame is the last of `port.frames(slot)`)."""
    windows: list[Window] = field(default_factory=list)
    finished: list[Member] = field(default_factory=list)


class Core:
    def __init__(self, artifact: Artifact, backend: Backend, *, chunk_frames: int = 4, first_chunk_frames: int = 1,
                 graph_window: int = 0):
        """`graph_window`: the speculative verify window requests use by default (TensorRT captures the
        code predictor's plans of that window as CUDA graphs at boot)."""
        self.artifact = artifact
        tables = artifact.tables()
        self.port = CodecPort(artifact.max_batch, artifact.max_seq, artifact.dims.code_groups)
        self.talker = TalkerStage(artifact, backend, get_family(artifact.family).talking(artifact), tables, self.port,
                                  graph_window=graph_window)
        self.vocoder = VocoderStage(artifact, backend, self.port, chunk_frames=chunk_frames,
                                    first_chunk_frames=first_chunk_frames)
        self.out = StepOutput()

    @property
    def window_samples(self) -> int:
        """The most PCM one step can hand out per member."""
        return self.vocoder.window_frames * self.artifact.samples_per_frame

    def preallocate(self) -> dict[str, int]:
        """Claim every buffer and bind every plan; returns bytes per part."""
        return {**self.talker.preallocate(), "codec_port": self.port.nbytes, **self.vocoder.preallocate()}

    def admit(self, request: SpeechRequest) -> tuple[bool, str]:
        return self.talker.admit(request)

    def prepare(self, request: SpeechRequest, slot: int, streamed: Streamed | None = None) -> Member:
        """Prefill `request` (a stream: its committed text so far) into `slot` and start its vocoder stream."""
        member = self.talker.prepare(request, slot, streamed)
        clone = request.clone
        if clone is not None and clone.icl:
            self.vocoder.prepare(slot, clone.ref_codes, clone.primed)
        else:
            self.vocoder.prepare(slot)
        return member

    def text_stream(self) -> TextStream:
        """A fresh incremental tokenizer for a streamed request (used off the loop thread)."""
        return self.talker.text_stream()

    def extend_text(self, member: Member, ids: list[int], final: bool) -> None:
        """A stream's newly committed text ids onto the member's text track."""
        self.talker.extend_text(member, ids, final)

    def ready(self, member: Member) -> bool:
        """Whether the member can step now (a stream whose committed text is used up waits)."""
        return self.talker.ready(member)

    def step(self, members: list[Member]) -> StepOutput:
        out = self.out
        out.frames = members
        out.windows.clear()
        out.finished.clear()
        self.talker.step_cohort(members)
        for m in members:
            if m.outcome is not Outcome.RUNNING:
                self.talker.finish(m)  # the port closes: the vocoder decodes the tail now
                out.finished.append(m)
            window = self.vocoder.decode(m.slot)
            if window is not None:
                out.windows.append(window)
        return out

    def stop(self, member: Member) -> None:
        """A member leaves before its end (cancelled, failed): no tail is decoded."""
        self.talker.finish(member)

    def frames(self, member: Member) -> np.ndarray:
        """The member's published frames, [n, G] (a view)."""
        return self.port.frames(member.slot)

    def diagnostics(self, member: Member) -> list[dict]:
        return [self.talker.diagnostics(member), self.vocoder.diagnostics(member.slot)]

    def warm_up(self) -> None:
        """One short utterance through every engine, so the first request pays no first-run cost."""
        member = self.prepare(SpeechRequest("warm-up", "Warm up.", sampling=Sampling(seed=0), max_frames=3), 0)
        while member.outcome is Outcome.RUNNING:
            self.step([member])
        self.reset()

    def reset(self) -> None:
        """Forget every member; buffers stay claimed. Idempotent."""
        self.talker.reset()
        self.vocoder.reset()
