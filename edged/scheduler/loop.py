"""The cohort loop: one thread owns the step core and makes one codec frame per member per step.

Other threads hand it commands through `inbox` (a queue); it answers through the `Clients` it is
handed, and sends audio where `Outputs` says. Each iteration, in order:

    commands -> text timeouts -> join (prefill newcomers into free slots) -> step (the members
    whose speaker buffer has room and whose text is there) -> outputs (windows to speaker,
    recorder, stream) -> ends -> watchdog progress

With the vocoder on its own thread, a step hands out the windows decoded while it computed, so a
step with no member to step still runs while windows are decoding (`Core.pending`): their audio
never waits for a paused member.

A cancel is applied at the next boundary, so it lands within one frame. A failure while preparing
one request fails that request only; a failure of a step fails the members of that step, and the
loop goes on. Streamed text (`more_text`) is tokenized on its own thread (`streams.TextWorker`);
the loop passes each piece through the request's text filter (edged.llm_text), copies the
committed ids' rows into the member's track, and a member whose text is used up sits out steps until
more comes (or a text timeout ends the stream: the first piece's, or the next piece's). Why a request
ended is the scheduler's to say; every accepted request gets exactly one `done`, when its
generation is over and, on the local speaker, when its audio has been heard.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Hashable

from edged.core import Core
from edged.llm_text import LlmText
from edged.scheduler.commands import Cancel, ClientLost, Command, Drain, MoreText, PlaybackEnded, StatusQuery, Submit
from edged.scheduler.outputs import Clients, History, Job, Outputs, Recorder, Speaker
from edged.scheduler.report import report
from edged.scheduler.scheduler import COMPLETE, Entry, Scheduler, Status
from edged.scheduler.status import Counters, Surroundings, status
from edged.scheduler.streams import Committed, TextIn, TextWorker

log = logging.getLogger("edged.loop")

IDLE_WAIT_S = 0.5
"""Longest wait for a command when nothing runs (the watchdog still hears from the loop)."""
PAUSED_WAIT_S = 0.005
"""Wait while every member is paused (a full speaker buffer, or no text yet): about half an audio
period (the speaker drains its buffers without telling the loop)."""


class CohortLoop:
    def __init__(self, core: Core, clients: Clients, *, inbox: queue.SimpleQueue | None = None, queue_limit: int = 16,
                 speaker: Speaker | None = None, reject_play_without_device: bool = False,
                 progress: Callable[[], None] = lambda: None, stall_after_steps: int = 0,
                 history: History | None = None, recorder: Recorder | None = None, text_timeout_s: float = 10.0,
                 first_text_timeout_s: float = 120.0):
        self.core = core
        self.clients = clients
        self.speaker = speaker
        self.history = history
        self.recorder = recorder
        self.outputs = Outputs(clients, speaker, recorder)
        self.inbox: queue.SimpleQueue = inbox if inbox is not None else queue.SimpleQueue()
        self.scheduler = Scheduler(core.artifact.max_batch, queue_limit)
        self.reject_play_without_device = reject_play_without_device
        self.progress = progress
        self.stall_after_steps = stall_after_steps
        self.counters = Counters()
        self.around = Surroundings()
        self.draining: Drain | None = None
        self.started = time.monotonic()
        self.text_timeout_s = text_timeout_s
        self.first_text_timeout_s = first_text_timeout_s
        self.texts = TextWorker(self.inbox)
        self.streams: dict[Hashable, Entry] = {}
        """Streamed requests whose text is still open (key -> entry), for the text timeouts."""

    def close(self) -> None:
        self.texts.stop()

    @property
    def busy(self) -> bool:
        """Requests in flight: waiting, generating, or still playing."""
        return bool(self.scheduler.by_key)

    # ----------------------------------------------------------------------------- one iteration

    def iteration(self) -> None:
        """One pass: commands, joins, one frame for every member whose reply has room, ends."""
        if self._has_work():
            self._commands(timeout=None)
        else:  # idle, or every member waits for room on the speaker or for text
            self._commands(timeout=PAUSED_WAIT_S if self.scheduler.running else IDLE_WAIT_S)
        self._drain_deadline()
        self._text_timeouts()
        self._join()
        entries = self._ready()
        if entries or self.core.pending:
            self._step(entries)
            if self.stall_after_steps and self.counters.steps >= self.stall_after_steps:
                log.warning("test_stall_after_steps reached: the loop hangs now")
                threading.Event().wait()
        self.progress()

    def _has_work(self) -> bool:
        s = self.scheduler
        if len(s.running) < s.max_batch and any(e.startable for e in s.waiting):
            return True
        return self.core.pending or any(self._has_room(e.payload) and self.core.ready(e.payload.member)
                                        for e in s.members)

    def _has_room(self, job: Job) -> bool:
        """Whether the reply's speaker buffer takes a step's audio (a full one pauses its member)."""
        return job.reply is None or self.speaker is None or self.speaker.room(job.reply) >= self.core.step_samples

    def _ready(self) -> list[Entry]:
        """The members that step now: room for their audio, and text to read (a streamed member
        whose text is used up waits; its wait is counted)."""
        now = time.monotonic()
        ready = []
        for entry in self.scheduler.members:
            job: Job = entry.payload
            assert job.member is not None
            if not self._has_room(job):
                continue
            if not self.core.ready(job.member):
                assert job.text is not None  # only a stream runs out of text
                job.text.waiting(now)
                continue
            if job.text is not None:
                job.text.resumed(now)
            ready.append(entry)
        return ready

    def _step(self, entries: list[Entry]) -> None:
        try:
            out = self.core.step([e.payload.member for e in entries])
        except Exception as exc:
            log.error("cohort step failed\n%s", traceback.format_exc())
            for entry in entries:
                self._end(entry, "error", f"engine step failed: {exc}")
            return
        if entries:
            self.counters.steps += 1
            self.counters.frames += len(entries)
        running = self.scheduler.running
        for window in out.windows:
            self.outputs.audio(running[window.slot].payload, window)
        for member in out.finished:
            self._end(running[member.slot], member.outcome.value)

    # ----------------------------------------------------------------------------- commands

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

    def _command(self, command: Command) -> None:
        if isinstance(command, Submit):
            self._submit(command)
        elif isinstance(command, Committed):
            self._committed(command)
        elif isinstance(command, MoreText):
            self._more_text(command)
        elif isinstance(command, Cancel):
            by_key = self.scheduler.by_key
            entries = ([e for e in by_key.values() if str(e.payload.id) == str(command.id)] if command.any_client
                       else [e for e in (by_key.get((command.client, command.id)),) if e is not None])
            for entry in entries:
                self._cancel(entry)
        elif isinstance(command, PlaybackEnded):
            self._playback_ended(command.reply)
        elif isinstance(command, StatusQuery):
            self.clients.status(command.client, status(self))
        elif isinstance(command, ClientLost):
            self._client_lost(command)
        elif isinstance(command, Drain):
            self.draining = command

    def _client_lost(self, c: ClientLost) -> None:
        """A client that is gone or not reading holds no slot: its waiting and running requests end
        with error (a reply already generated and playing on the speaker plays out)."""
        for entry in [e for e in self.scheduler.by_key.values() if e.payload.submit.client == c.client]:
            if entry.status in (Status.WAITING, Status.RUNNING):
                log.warning("request ended: %s", c.reason, extra={"request_id": str(entry.payload.id)})
                self._end(entry, "error", c.reason)

    def _submit(self, s: Submit) -> None:
        speaker = self.speaker if self.speaker is not None and self.speaker.available else None
        reason = None
        if self.draining:
            reason = "shutting down"
        elif s.play and self.reject_play_without_device and speaker is None:
            reason = "no audio device for play: true (send play: false, or stream: true)"
        elif s.play and speaker is not None and not speaker.can_begin():
            reason = "busy: every speaker buffer is taken by replies waiting to play"
        if reason is None:
            ok, why = self.core.admit(s.request)
            reason = None if ok else why
        key = (s.client, s.request.id)
        job = Job(s, time.monotonic())
        entry = Entry(key, job, startable=not s.request.more_text)
        if reason is None:
            reason = self.scheduler.submit(entry)
        if reason is not None:
            self.counters.rejected += 1
            self.clients.rejected(s.client, s.request.id, reason)
            if s.session and self.history is not None:
                self.history.unreserve(s.client, s.request.id, s.reservation)
            return
        self.counters.accepted += 1
        if s.play and self.speaker is not None:
            job.reply = self.speaker.begin(key, s.request.id)
            entry.plays = job.reply is not None
        self.clients.accepted(s.client, s.request.id)
        if s.request.more_text:
            job.text = TextIn(self.core.text_stream(), job.accepted_at,
                              LlmText() if s.request.text_filter == "llm" else None)
            self.streams[key] = entry
            self._piece(entry, s.request.text, final=False)

    # ----------------------------------------------------------------------------- streamed text

    def _more_text(self, c: MoreText) -> None:
        entry = self.scheduler.by_key.get((c.client, c.id))
        if entry is None:
            self.clients.error(c.client, c.id, f"text: no speak with id {c.id!r} is in flight")
        elif entry.payload.text is None:
            self.clients.error(c.client, c.id, f"text: speak {c.id!r} was not sent with more_text")
        elif entry.payload.text.closed:
            self.clients.error(c.client, c.id, f"text: speak {c.id!r} already had its final text")
        else:
            self._piece(entry, c.text, c.final)

    def _piece(self, entry: Entry, text: str, final: bool) -> None:
        """One piece of a stream, in order, through its text filter to the tokenizer thread."""
        t: TextIn = entry.payload.text
        if final:
            self._close(entry)
        try:
            spoken = t.take(text, final, time.monotonic())
        except Exception as exc:  # a filter failure fails that request only
            log.error("filtering a text piece failed\n%s", traceback.format_exc(), extra={"request_id": str(entry.payload.id)})
            self._close(entry)
            if entry.status in (Status.WAITING, Status.RUNNING):
                self._end(entry, "error", f"text filter failed: {exc}")
            return
        if spoken or final:
            self.texts.put(entry.key, t.stream, spoken, final)

    def _close(self, entry: Entry) -> None:
        """No more text for this stream: a later `text` is an error, and no timeout applies."""
        entry.payload.text.closed = True
        self.streams.pop(entry.key, None)

    def _text_timeouts(self) -> None:
        """A stream with no text `first_text_timeout_s` after its acceptance ends with an error; one
        whose next piece is late by `text_timeout_s` is final (its held-back text is spoken)."""
        if not self.streams:
            return
        now = time.monotonic()
        for entry in list(self.streams.values()):
            job: Job = entry.payload
            t = job.text
            assert t is not None  # only streams are here
            if not t.has_text and now - job.accepted_at > self.first_text_timeout_s:
                log.warning("no text came: the stream ends", extra={"request_id": str(job.id)})
                t.timed_out = "daemon.first_text_timeout_ms"
                self._close(entry)
                self._end(entry, "error", f"no text came within daemon.first_text_timeout_ms "
                                          f"({self.first_text_timeout_s * 1000:.0f} ms)")
            elif t.has_text and now - t.last_piece_at > self.text_timeout_s:
                log.warning("text stream timed out: treated as final", extra={"request_id": str(job.id)})
                t.timed_out = "daemon.text_timeout_ms"
                self._piece(entry, "", final=True)

    def _committed(self, c: Committed) -> None:
        """Ids the tokenizer is sure of: onto the member's track, or kept until the request joins."""
        entry = self.scheduler.by_key.get(c.key)
        if entry is None or entry.payload.text is None or entry.payload.text.stream is not c.stream:
            return  # the request has ended (or this is another request with the same id)
        job: Job = entry.payload
        t = entry.payload.text
        t.final = c.final
        if c.error or (c.final and not t.text.strip()):
            empty = "text is empty" if t.blank else "text is empty after the llm text filter (all of it was reasoning or markup)"
            self._end(entry, "error", c.error or empty)
        elif entry.status is Status.WAITING:
            t.ids += c.ids
            entry.startable = bool(t.ids)
        elif entry.status is Status.RUNNING and job.member is not None:
            self.core.extend_text(job.member, c.ids, c.final)
        elif c.ids:
            t.late = True  # generation is over: this text is never spoken

    def _drain_deadline(self) -> None:
        if self.draining and time.monotonic() >= self.draining.deadline:
            for entry in list(self.scheduler.by_key.values()):
                self._cancel(entry)

    def _cancel(self, entry: Entry) -> None:
        """Waiting: ends at once; running: at the next frame boundary; playing: when its cut is heard."""
        job: Job = entry.payload
        if entry.status is Status.PLAYING:
            if job.reply is not None and self.speaker is not None:
                self.speaker.stop(job.reply)
            return
        if job.cancelled_at_frame is None:
            job.cancelled_at_frame = job.member.frames if job.member else 0
        self.scheduler.cancel(entry.key)
        if entry.status.finished:
            self._done(entry)

    def _playback_ended(self, reply) -> None:
        """The speaker is through with a reply: its done goes out now, or when generation stops."""
        entry = self.scheduler.by_key.get(reply.key)
        if entry is None or entry.payload.reply is not reply:
            return
        entry.payload.played = reply.played
        cut = None
        if reply.error:
            cut = "error"
        elif reply.interrupted:
            cut = "interrupted"
        elif reply.stopped:
            cut = "stopped"
        if entry.status is Status.RUNNING and entry.payload.cancelled_at_frame is None:
            entry.payload.cancelled_at_frame = entry.payload.member.frames if entry.payload.member else 0
        self.scheduler.played(entry, cut, reply.error)
        if entry.status.finished:
            self._done(entry)

    # ----------------------------------------------------------------------------- joins and ends

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
                streamed = job.text.streamed() if job.text is not None else None
                job.member = self.core.prepare(job.submit.request, slot, streamed)
                if self.recorder is not None and job.submit.session:
                    self.recorder.start(slot)
            except Exception as exc:  # a bad request fails alone; the cohort goes on
                log.error("prepare failed\n%s", traceback.format_exc(), extra={"request_id": str(job.id)})
                self._end(entry, "error", f"prepare failed: {exc}")

    def _end(self, entry: Entry, reason: str, error: str | None = None) -> None:
        """Generation is over. Without a speaker reply that is the end; with one, done waits until the
        speaker has played (or cut) the rest."""
        job: Job = entry.payload
        job.generated_at = time.monotonic()
        if job.member is not None:
            self.core.stop(job.member)
            if self.recorder is not None:
                job.pcm = self.recorder.take(job.member.slot)
        self.scheduler.end(entry, reason, error)
        if entry.status.finished:
            self._done(entry)
            return
        assert self.speaker is not None
        if entry.ending in COMPLETE:
            self.speaker.end(job.reply)
        else:
            self.speaker.stop(job.reply)

    def _done(self, entry: Entry) -> None:
        job: Job = entry.payload
        if self.streams.get(entry.key) is entry:  # its text timeout no longer applies
            del self.streams[entry.key]
        reason = entry.status.reason
        error = entry.error if entry.status is Status.FINISHED_ERROR else None
        self.counters.done[reason] += 1
        fields = report(entry, self.core)
        if job.submit.session and self.history is not None:  # first: whatever the client sends after done comes after it
            played = fields.get("played_ms") if job.submit.play else None
            generated_ms = job.samples_sent * 1000 // self.core.artifact.sample_rate
            self.history.ended(job.submit.client, job.id, reason, generated_ms, played, job.pcm,
                               self.core.artifact.sample_rate, job.text.text if job.text is not None else None)
        self.clients.done(job.submit.client, job.id, reason, error, fields)
        log.info("done", extra={"request_id": str(job.id), "reason": reason})
