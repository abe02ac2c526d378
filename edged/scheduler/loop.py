"""The cohort loop: one thread owns the engines and makes one codec frame per member per step.

The server thread hands it commands through `inbox` (a queue); it answers through `reply`, a
function that only this thread calls. Each iteration, in order:

    commands -> join (prefill newcomers into free slots) -> step (talker + vocoder, one frame each)
    -> finish (done for every member that ended) -> watchdog progress

A cancel is applied at the next boundary, so it lands within one frame. A failure while preparing
one request fails that request only; a failure of a batched engine step fails the members of that
step, and the loop goes on. Every accepted request gets exactly one `done`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.artifact import Artifact
from edged.audio.speaker import Reply as SpeakerReply
from edged.audio.speaker import Speaker
from edged.backends import Backend
from edged.history.recorder import Recorder
from edged.history.service import Ended, History, Unreserve
from edged.protocol import Accepted, Audio, Done, Rejected, StatusReply
from edged.request import SpeechRequest
from edged.scheduler.scheduler import Entry, Scheduler
from edged.talker.port import CodecPort
from edged.talker.stage import Member, Outcome, TalkerStage
from edged.vocoder.stage import VocoderStage

log = logging.getLogger("edged.loop")

IDLE_WAIT_S = 0.5
"""Longest wait for a command when nothing runs (the watchdog still hears from the loop)."""
PAUSED_WAIT_S = 0.005
"""Wait while every member is paused on a full speaker buffer: about half an audio period."""

Reply = Callable[[bytes, Any, "memoryview | None"], None]
"""reply(client, message, pcm): send one message (and its PCM frame) to one client."""


# --------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Submit:
    client: bytes
    request: SpeechRequest
    stream: bool = False
    format: str = "f32le"
    play: bool = True
    report_codes: bool = False
    session: str | None = None
    """The conversation whose history gets this reply (the history thread reserved its slot)."""


@dataclass(frozen=True)
class Cancel:
    client: bytes
    id: Hashable


@dataclass(frozen=True)
class StatusQuery:
    client: bytes


@dataclass(frozen=True)
class PlaybackEnded:
    """From the speaker: the reply's last sample (or its cut) has passed the DAC."""

    reply: SpeakerReply


@dataclass(frozen=True)
class Drain:
    """Stop admitting; finish what is in flight until `deadline` (monotonic), then cancel the rest."""

    deadline: float


@dataclass
class Job:
    """What the loop keeps per accepted request (the scheduler entry's payload)."""

    submit: Submit
    accepted_at: float
    member: Member | None = None
    seq: int = 0
    samples_sent: int = 0
    first_audio_at: float | None = None
    cancelled_at_frame: int | None = None
    error: str | None = None
    started_at: float | None = None
    reply: SpeakerReply | None = None
    """The reply on the local speaker (play: true with a device)."""
    played: int | None = None
    """Samples heard, once the speaker says the reply has ended."""
    generated_at: float | None = None
    pcm: np.ndarray | None = None
    """The whole reply's audio for calibration (asr policy), taken when generation ends."""
    reason: str | None = None
    """A terminal reason decided outside generation (cancelled while playing, interrupted, error)."""


@dataclass
class Counters:
    accepted: int = 0
    rejected: int = 0
    done: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ("eos", "length", "cancelled", "interrupted", "error")})
    frames: int = 0
    steps: int = 0


# --------------------------------------------------------------------------------------- the loop


class CohortLoop:
    def __init__(self, artifact: Artifact, backend: Backend, reply: Reply, *, queue_limit: int = 16,
                 chunk_frames: int = 4, first_chunk_frames: int = 1, speaker: Speaker | None = None,
                 reject_play_without_device: bool = False, progress: Callable[[], None] = lambda: None,
                 stall_after_steps: int = 0, history: History | None = None, recorder: Recorder | None = None):
        self.artifact = artifact
        self.history = history
        self.recorder = recorder
        self.reply = reply
        self.progress = progress
        self.speaker = speaker
        self.input_status: Callable[[], dict] = lambda: {"state": "off"}
        """The microphone's part of `status` (the daemon sets it when there is a listener)."""
        self.playing: dict[Hashable, Entry] = {}
        """Requests whose generation ended while their audio still plays: done waits for the speaker."""
        self.reject_play_without_device = reject_play_without_device
        self.stall_after_steps = stall_after_steps
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.scheduler = Scheduler(artifact.max_batch, queue_limit)
        self.port = CodecPort(artifact.max_batch, artifact.max_seq, artifact.dims.code_groups)
        self.talker = TalkerStage(artifact, backend, artifact.tables(), self.port)
        self.vocoder = VocoderStage(artifact, backend, self.port, self._on_pcm,
                                    chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
        window = artifact.samples_per_frame * max(chunk_frames, first_chunk_frames)
        self.window = window
        """Most PCM one step (and its finish) can emit per member: a paused reply needs this much room."""
        self.s16 = np.zeros(window, dtype="<i2")  # s16le conversion buffers, one window each
        self.scaled = np.zeros(window, dtype=np.float32)
        self.counters = Counters()
        self.claimed: dict[str, int] = {}
        self.draining: Drain | None = None
        self.started = time.monotonic()

    # ----------------------------------------------------------------------------- boot

    def preallocate(self) -> dict[str, int]:
        self.claimed = {**self.talker.preallocate(), **self.vocoder.preallocate()}
        return self.claimed

    def warm_up(self) -> None:
        """One short utterance through every engine, so the first client pays no first-run cost."""
        request = SpeechRequest(id="warm-up", text="Warm up.", max_frames=3)
        member = self.talker.prepare(request, 0)
        self.vocoder.prepare(0)
        sink, self.vocoder.sink = self.vocoder.sink, lambda *_: None
        try:
            while member.outcome is Outcome.RUNNING:
                self.talker.step_cohort([member])
                self.vocoder.step_cohort([0])
            self.talker.finish(member, member.outcome.value)
            self.vocoder.finish(0)
        finally:
            self.vocoder.sink = sink
        self.talker.reset()
        self.vocoder.reset()

    # ----------------------------------------------------------------------------- run

    @property
    def busy(self) -> bool:
        """Requests in flight: generating, waiting, or still playing."""
        return bool(self.scheduler.by_key or self.playing)

    def iteration(self) -> None:
        """One pass: commands, joins, one frame for every member whose reply has room, finishes.
        The daemon calls it in a loop."""
        ready = [e for e in self.scheduler.members if not self._paused(e)]
        if ready or self.scheduler.waiting:
            self._commands(timeout=None)
        else:  # idle, or every member waits for the speaker to drain its buffer
            self._commands(timeout=PAUSED_WAIT_S if self.scheduler.running else IDLE_WAIT_S)
        self._drain_deadline()
        self._join()
        members = [e for e in self.scheduler.members if not self._paused(e)]
        if members:
            self._step(members)
            if self.stall_after_steps and self.counters.steps >= self.stall_after_steps:
                log.warning("test_stall_after_steps reached: the loop hangs now")
                threading.Event().wait()
        self.progress()

    def _paused(self, entry: Entry) -> bool:
        reply = entry.payload.reply
        return reply is not None and self.speaker is not None and self.speaker.room(reply) < self.window

    def _commands(self, timeout: float | None) -> None:
        """Apply every queued command; with a timeout, first wait that long for one."""
        try:
            command = self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._command(command)
            try:
                command = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _command(self, command) -> None:
        if isinstance(command, Submit):
            self._submit(command)
        elif isinstance(command, Cancel):
            key = (command.client, command.id)
            entry = self.scheduler.by_key.get(key) or self.playing.get(key)
            if entry is not None:
                self._cancel(entry)
        elif isinstance(command, PlaybackEnded):
            self._playback_ended(command.reply)
        elif isinstance(command, StatusQuery):
            self.reply(command.client, StatusReply(self.status()), None)
        elif isinstance(command, Drain):
            self.draining = command

    def _submit(self, s: Submit) -> None:
        reason = None
        if self.draining:
            reason = "shutting down"
        elif s.play and self.reject_play_without_device and not (self.speaker and self.speaker.available):
            reason = "no audio device for play: true (send play: false, or stream: true)"
        elif s.play and self.speaker and self.speaker.available and not self.speaker.can_begin():
            reason = "busy: every speaker buffer is taken by replies waiting to play"
        if reason is None:
            ok, why = self.talker.admit(s.request)
            reason = None if ok else why
        if reason is None:
            reason = self.scheduler.submit(Entry((s.client, s.request.id), Job(s, time.monotonic())))
        if reason is not None:
            self.counters.rejected += 1
            self.reply(s.client, Rejected(s.request.id, reason), None)
            if s.session and self.history is not None:
                self.history.inbox.put(Unreserve(s.client, s.request.id))
            return
        self.counters.accepted += 1
        if s.play and self.speaker is not None:
            entry = self.scheduler.by_key[(s.client, s.request.id)]
            entry.payload.reply = self.speaker.begin(entry.key, s.request.id)
        self.reply(s.client, Accepted(s.request.id), None)

    def _drain_deadline(self) -> None:
        if self.draining and time.monotonic() >= self.draining.deadline:
            for entry in [*self.scheduler.by_key.values(), *self.playing.values()]:
                self._cancel(entry)

    def _cancel(self, entry: Entry) -> None:
        """A waiting request ends at once, a running one at the next frame boundary, a playing one
        when its cut has passed the DAC."""
        job: Job = entry.payload
        if entry.key in self.playing:
            if job.reason is None:
                job.reason = "cancelled"
            if job.reply is not None and self.speaker is not None:
                self.speaker.stop(job.reply)
            return
        if job.cancelled_at_frame is None:
            job.cancelled_at_frame = job.member.frames if job.member else 0
        self.scheduler.cancel(entry.key)
        if entry.status.finished:
            self._generated(entry)

    def _playback_ended(self, reply: SpeakerReply) -> None:
        """The speaker is through with a reply: its done goes out now, or when generation stops."""
        entry = self.playing.pop(reply.key, None) or self.scheduler.by_key.get(reply.key)
        if entry is None or entry.payload.reply is not reply:
            return
        job: Job = entry.payload
        job.played = reply.played
        if not reply.stopped and not reply.error:
            job.reason = None  # it played to the end before a cancel could cut it
        elif job.reason is None and (reply.interrupted or reply.error):
            job.reason = "interrupted" if reply.interrupted else "error"
            job.error = job.error or reply.error
        if entry.status.finished:
            self._done(entry)
        else:  # cut while still generating (barge-in, device lost): generation stops too
            self._cancel(entry)

    def _join(self) -> None:
        """Cancelled members leave, newcomers take their slots: all at this frame boundary."""
        for entry in self.scheduler.members:
            if entry.cancel_requested:
                self._end(entry, "cancelled")
        for entry in self.scheduler.join():
            job: Job = entry.payload
            job.started_at = time.monotonic()
            slot = entry.slot
            assert slot is not None
            try:
                job.member = self.talker.prepare(job.submit.request, slot)
                self.vocoder.prepare(slot)
                if self.recorder is not None and job.submit.session:
                    self.recorder.start(slot)
            except Exception as exc:  # a bad request fails alone; the cohort goes on
                log.error("prepare failed\n%s", traceback.format_exc(), extra={"request_id": str(job.submit.request.id)})
                job.error = f"prepare failed: {exc}"
                self._end(entry, "error")

    def _step(self, entries: list[Entry]) -> None:
        members = [e.payload.member for e in entries]
        try:
            self.talker.step_cohort(members)
            self.vocoder.step_cohort([m.slot for m in members])
        except Exception as exc:
            log.error("cohort step failed\n%s", traceback.format_exc())
            for entry in entries:
                entry.payload.error = f"engine step failed: {exc}"
                self._end(entry, "error")
            return
        self.counters.steps += 1
        self.counters.frames += len(members)
        for entry, member in zip(entries, members):
            if member.outcome is not Outcome.RUNNING:
                self._end(entry, member.outcome.value)

    def _end(self, entry: Entry, reason: str) -> None:
        job: Job = entry.payload
        if job.member is not None:
            self.talker.finish(job.member, reason)
            if self.recorder is not None:
                job.pcm = self.recorder.take(job.member.slot)
            if reason in ("eos", "length"):
                try:
                    self.vocoder.finish(job.member.slot)  # decode the tail: the utterance completes
                except Exception as exc:
                    log.error("vocoder tail failed\n%s", traceback.format_exc())
                    job.error, reason = f"vocoder failed: {exc}", "error"
        self.scheduler.finish(entry, reason)
        self._generated(entry)

    def _generated(self, entry: Entry) -> None:
        """Generation is over. Without a speaker reply that is the end; with one, done waits until
        the speaker has played (or cut) the rest."""
        job: Job = entry.payload
        job.generated_at = time.monotonic()
        if job.reply is None or self.speaker is None or job.played is not None:
            self._done(entry)
            return
        if entry.status.reason in ("eos", "length") and job.reason is None:
            self.speaker.end(job.reply)
        else:
            self.speaker.stop(job.reply)
        self.playing[entry.key] = entry

    # ----------------------------------------------------------------------------- replies

    def _on_pcm(self, slot: int, first_sample: int, samples: np.ndarray) -> None:
        entry = self.scheduler.running.get(slot)
        if entry is None:
            return
        job: Job = entry.payload
        if job.first_audio_at is None:
            job.first_audio_at = time.monotonic()
        job.samples_sent = first_sample + samples.shape[0]
        if job.reply is not None and self.speaker is not None:
            self.speaker.write(job.reply, samples)
        if self.recorder is not None:
            self.recorder.write(slot, first_sample, samples)
        if not job.submit.stream:
            return
        if job.submit.format == "s16le":
            n = samples.shape[0]
            np.multiply(samples, 32767.0, out=self.scaled[:n])
            np.rint(self.scaled[:n], out=self.scaled[:n])
            self.s16[:n] = self.scaled[:n]
            pcm = self.s16[:n].data.cast("B")
        else:
            pcm = samples.data.cast("B")
        header = Audio(job.submit.request.id, job.seq, self.artifact.sample_rate, job.submit.format,
                       first_sample, int(samples.shape[0]))
        self.reply(job.submit.client, header, pcm)
        job.seq += 1

    def _done(self, entry: Entry) -> None:
        job: Job = entry.payload
        reason = job.reason or entry.status.reason
        self.counters.done[reason] += 1
        report = self._report(job, reason)
        if job.submit.session and self.history is not None:  # first: whatever the client sends after done comes after it
            played = report.get("played_ms") if job.submit.play else None
            generated_ms = job.samples_sent * 1000 // self.artifact.sample_rate
            self.history.inbox.put(Ended(job.submit.client, job.submit.request.id, reason, generated_ms, played,
                                         job.pcm, self.artifact.sample_rate))
        self.reply(job.submit.client, Done(job.submit.request.id, reason, job.error, report), None)
        log.info("done", extra={"request_id": str(job.submit.request.id), "reason": reason})

    def _report(self, job: Job, reason: str) -> dict:
        now = time.monotonic()
        m = job.member
        audio_s = job.samples_sent / self.artifact.sample_rate
        report: dict[str, Any] = {
            "reason": reason,
            "frames": m.frames if m else 0,
            "audio_ms": round(audio_s * 1e3, 1),
            "queued_ms": round(((job.started_at or now) - job.accepted_at) * 1e3, 3),
            "first_audio_ms": round((job.first_audio_at - job.accepted_at) * 1e3, 3) if job.first_audio_at else None,
            "rtf": round(((job.generated_at or now) - job.started_at) / audio_s, 4) if audio_s and job.started_at else None,
            "stages": [self.talker.diagnostics(m), self.vocoder.diagnostics(m.slot)] if m else [],
        }
        if job.cancelled_at_frame is not None:
            report["cancelled_at_frame"] = job.cancelled_at_frame
        if job.submit.play:
            report["played_ms"] = job.played * 1000 // self.artifact.sample_rate if job.played is not None else 0
            if job.reply is None:
                report["playback"] = "no output device"
        if job.submit.report_codes:
            report["rvq_codes"] = self.port.frames(m.slot).tolist() if m else []
        return report

    def status(self) -> dict:
        running = self.scheduler.members
        return {
            "state": "draining" if self.draining else "serving",
            "uptime_s": round(time.monotonic() - self.started, 3),
            "artifact": str(self.artifact.path), "family": self.artifact.family,
            "cohort": {"running": len(running), "max_batch": self.artifact.max_batch,
                       "members": [str(e.payload.submit.request.id) for e in running]},
            "queue": {"waiting": len(self.scheduler.waiting), "limit": self.scheduler.queue_limit},
            "counters": {"accepted": self.counters.accepted, "rejected": self.counters.rejected,
                         "done": dict(self.counters.done), "frames": self.counters.frames, "steps": self.counters.steps},
            "memory": dict(self.claimed),
            "audio": {"output": self.speaker.status() if self.speaker is not None else {"state": "off"},
                      "input": self.input_status()},
            "playing": len(self.playing),
            "history": self.history.snapshot if self.history is not None else {},
        }
