"""One step core for everything that generates speech (nano-vllm's `step()` returns its outputs).

`Core.step(members)` makes exactly one codec frame for each member it is given and returns what
that step made: the members that made a frame, the vocoder windows that were decoded, and the
members that finished (eos, or their frame limit; their last window is already in `windows`).
Members that are not given (paused: waiting for room in their speaker buffer, or for text) come out
of the step unchanged, whatever slot they hold. The caller decides where the outputs go.

With `vocoder_threads`, the vocoder runs on a thread of its own (`VocoderWorker`) over engines of
its own: the windows that became ready in one step are decoded while the next steps compute, and
come out of the first step that ends after they are decoded; a step that stages a window first
waits for them (so the worker has one list at a time and a slot's windows come out in order), and a
step with no members waits for them and only collects them (`pending` says there are some). A
window takes the vocoder several frames' time (4 frames a window by default), so it is not waited
for at the step after it was handed over. A stream's first window and its last are decoded before
the step returns, so first audio comes as soon as inline, and a member's last window comes out with its finish. Without
(`vocoder_threads` 0, or a TensorRT backend: one CUDA stream, current on the step thread), each
window is decoded inline, in the step that made it ready. Either way the frames, the windows and
their PCM are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edged.artifact import Artifact
from edged.backends import Backend, make_backend
from edged.core.port import CodecPort
from edged.families import get_family
from edged.request import Sampling, SpeechRequest
from edged.talker.stage import Member, Outcome, TalkerStage
from edged.talker.text import Streamed, TextStream
from edged.vocoder.stage import VocoderStage, Window
from edged.vocoder.worker import VocoderWorker


@dataclass
class StepOutput:
    """What one step made; the lists are reused by the next step."""

    frames: list[Member] = field(default_factory=list)
    """Members that made a frame (their newest frame is the last of `port.frames(slot)`)."""
    windows: list[Window] = field(default_factory=list)
    finished: list[Member] = field(default_factory=list)


class Core:
    def __init__(self, artifact: Artifact, backend: Backend, *, vocoder_threads: int = 0, chunk_frames: int = 4,
                 first_chunk_frames: int = 1, graph_window: int = 0):
        """`graph_window`: the speculative verify window requests use by default (TensorRT captures the
        code predictor's plans of that window as CUDA graphs at boot)."""
        self.artifact = artifact
        tables = artifact.tables()
        self.port = CodecPort(artifact.max_batch, artifact.max_seq, artifact.dims.code_groups)
        self.talker = TalkerStage(artifact, backend, get_family(artifact.family).talking(artifact), tables, self.port,
                                  graph_window=graph_window)
        # the vocoder's own engines where its backend can run them on another thread
        self.vocoder_backend = make_backend("onnxruntime", vocoder_threads) if (
            vocoder_threads and backend.name == "onnxruntime") else None
        self.vocoder = VocoderStage(artifact, self.vocoder_backend or backend, self.port, chunk_frames=chunk_frames,
                                    first_chunk_frames=first_chunk_frames)
        self.worker = VocoderWorker(self.vocoder.fill, threaded=self.vocoder_backend is not None)
        self.now: list[Window] = []
        """Windows decoded before the step returns (all of them, not threaded)."""
        self.later: list[Window] = []
        """Windows handed to the worker, decoding while the next steps compute."""
        self.staged: list[Window] = []
        """Windows staged in this step for the worker (handed over at its end)."""
        self.dropped = np.zeros(artifact.max_batch, dtype=bool)
        """Slots stopped while a window of theirs was decoding: that window is not handed out."""
        self.out = StepOutput()

    @property
    def window_samples(self) -> int:
        """The most PCM one window holds."""
        return self.vocoder.window_frames * self.artifact.samples_per_frame

    @property
    def step_samples(self) -> int:
        """The most PCM one step can hand out per member: with the worker, the window decoded while
        it computed and a first or last one."""
        return self.window_samples * (2 if self.worker.threaded else 1)

    @property
    def pending(self) -> bool:
        """Windows are decoding that the next step hands out (with or without members)."""
        return bool(self.later)

    def preallocate(self) -> dict[str, int]:
        """Claim every buffer and bind every plan (a plan bound later, reserved), then seal the backend:
        it claims nothing more; returns bytes per part."""
        claimed = {**self.talker.preallocate(), "codec_port": self.port.nbytes, **self.vocoder.preallocate()}
        self.talker.backend.seal()
        return claimed

    def admit(self, request: SpeechRequest) -> tuple[bool, str]:
        return self.talker.admit(request)

    def prepare(self, request: SpeechRequest, slot: int, streamed: Streamed | None = None) -> Member:
        """Prefill `request` (a stream: its committed text so far) into `slot` and start its vocoder stream."""
        member = self.talker.prepare(request, slot, streamed)
        self._forget(slot)
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
        if members:
            self.talker.step_cohort(members)
        self._collect(out.windows, wait=not members)  # decoded while this step (and earlier ones) computed
        for m in members:
            ending = m.outcome is not Outcome.RUNNING
            if ending:
                self.talker.finish(m)  # the port closes: the vocoder decodes the tail now
                out.finished.append(m)
            if not (ending or self.vocoder.ready(m.slot)):
                continue
            # the worker idle before a window is staged; a slot's windows in order; a finished one's all out
            self._collect(out.windows, wait=True)
            window = self.vocoder.next_window(m.slot)
            if window is not None:
                overlap = self.worker.threaded and not (window.first or window.last)
                (self.staged if overlap else self.now).append(window)
        self._decode_now(out.windows)
        if self.staged:
            assert not self.later  # staging waited for them
            self.later, self.staged = self.staged, self.later
            self.worker.start(self.later)
        return out

    def _collect(self, out: list[Window], wait: bool) -> None:
        """The windows handed to the worker, once decoded (a stopped slot's left out); without `wait`,
        only if the worker has finished them."""
        if not self.later or not (wait or self.worker.done()):
            return
        try:
            self.worker.wait()
            for window in self.later:
                if not self.dropped[window.slot]:
                    out.append(window)
        finally:
            self.later.clear()

    def _decode_now(self, out: list[Window]) -> None:
        if not self.now:
            return
        try:
            self.worker.run(self.now)
            out.extend(self.now)
        finally:
            self.now.clear()

    def _forget(self, slot: int) -> None:
        """A slot starts over: a window of its last stream still decoding is waited for and dropped."""
        if any(w.slot == slot for w in self.later):
            self.worker.wait()
            self.later[:] = [w for w in self.later if w.slot != slot]
        self.dropped[slot] = False

    def stop(self, member: Member) -> None:
        """A member leaves before its end (cancelled, failed): no tail is decoded, and a window of
        its still decoding is not handed out."""
        self.talker.finish(member)
        self.dropped[member.slot] = True

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
        self.worker.wait()
        self.later.clear()
        self.dropped[:] = False
        self.talker.reset()
        self.vocoder.reset()

    def close(self) -> None:
        """Stop the vocoder's thread and release its engines (the caller closes its own backend)."""
        self.worker.close()
        if self.vocoder_backend is not None:
            self.vocoder_backend.close()
