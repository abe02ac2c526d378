"""The cohort loop driven in-process: commands in, replies out, one iteration at a time."""

from __future__ import annotations

import time

import pytest
from support.loops import run_until_idle

from edged import protocol as wire
from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.scheduler.commands import Cancel, Drain, MoreText, PlaybackEnded, StatusQuery, Submit
from edged.scheduler.loop import CohortLoop
from edged.server.replies import ClientReplies


def make_loop(builtin_artifact, backend, vocoder_threads: int = 0, chunk_frames: int = 4, **kwargs):
    replies = []
    core = Core(load_artifact(builtin_artifact), backend, vocoder_threads=vocoder_threads, chunk_frames=chunk_frames)
    core.preallocate()
    clients = ClientReplies(lambda c, m, p: replies.append((c, m)), core.artifact.sample_rate, core.window_samples)
    return CohortLoop(core, clients, **kwargs), replies


@pytest.mark.parametrize("vocoder_threads", [0, 1])
def test_each_accepted_request_gets_exactly_one_done(builtin_artifact, backend, vocoder_threads):
    loop, replies = make_loop(builtin_artifact, backend, vocoder_threads, queue_limit=8)
    for i in range(6):
        loop.inbox.put(Submit(b"c", SpeechRequest(f"r{i}", f"Request {i}.", max_frames=3 + i, sampling=Sampling(seed=i)),
                              play=False))
    loop.inbox.put(Submit(b"c", SpeechRequest("bad", "Hi.", voice="nobody"), play=False))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert sorted(d.id for d in done) == [f"r{i}" for i in range(6)]
    assert {d.id: d.report["frames"] for d in done} == {f"r{i}": 3 + i for i in range(6)}
    assert {d.id: d.report["audio_ms"] for d in done} == {f"r{i}": (3 + i) * 80.0 for i in range(6)}
    assert [m.id for _, m in replies if isinstance(m, wire.Rejected)] == ["bad"]
    loop.core.close()


def test_draining_stops_admitting_and_the_deadline_cancels(builtin_artifact, backend):
    loop, replies = make_loop(builtin_artifact, backend)
    loop.inbox.put(Submit(b"c", SpeechRequest("long", "A long one.", max_frames=400), play=False))
    loop.iteration()
    loop.inbox.put(Drain(time.monotonic() + 0.05))
    loop.inbox.put(Submit(b"c", SpeechRequest("late", "Too late."), play=False))
    run_until_idle(loop)
    rejected = [m for _, m in replies if isinstance(m, wire.Rejected)]
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert [(r.id, r.reason) for r in rejected] == [("late", "shutting down")]
    assert [(d.id, d.reason) for d in done] == [("long", "cancelled")]


@pytest.mark.parametrize("vocoder_threads", [0, 1])
def test_cancel_and_status(builtin_artifact, backend, vocoder_threads):
    """A cancel lands at the next frame boundary, with the vocoder inline and on its own thread: no
    frame after it, and no audio after the `done` (a window still decoding is dropped)."""
    loop, replies = make_loop(builtin_artifact, backend, vocoder_threads)
    loop.inbox.put(Submit(b"c", SpeechRequest("x", "Cancel me.", max_frames=400), play=False, stream=True))
    for _ in range(5):
        loop.iteration()
    assert loop.core.pending == bool(vocoder_threads)  # frames 2..5: a window on the vocoder's thread
    loop.inbox.put(Cancel(b"c", "x"))
    loop.inbox.put(Cancel(b"other-client", "x"))  # ids are per client: this one is unknown, ignored
    loop.inbox.put(StatusQuery(b"c"))
    run_until_idle(loop)
    messages = [m for _, m in replies if isinstance(m, (wire.Audio, wire.Done))]
    done = messages[-1]
    assert isinstance(done, wire.Done) and [m for m in messages if isinstance(m, wire.Done)] == [done]
    assert done.reason == "cancelled" and done.report["frames"] == done.report["cancelled_at_frame"] == 5
    assert not loop.core.pending
    status = [m for _, m in replies if isinstance(m, wire.StatusReply)][0].fields
    assert status["cohort"]["running"] == 1 and status["counters"]["accepted"] == 1
    loop.core.close()


def test_a_window_still_decoding_comes_out_while_every_member_waits(builtin_artifact, backend):
    """With the vocoder on its own thread a step hands out the windows decoded while it computed. A
    streamed member whose text is used up waits; the window of its last frame still comes out, in
    an iteration that steps no member, and the loop then idles until more text comes."""
    loop, replies = make_loop(builtin_artifact, backend, vocoder_threads=1, chunk_frames=1)
    request = SpeechRequest("s", "A few words first,", more_text=True, dual_track=True, sampling=Sampling.greedy(),
                            max_frames=400)
    loop.inbox.put(Submit(b"c", request, play=False, stream=True))
    for _ in range(400):
        pending, steps = loop.core.pending, loop.counters.steps
        loop.iteration()
        entry = loop.scheduler.by_key.get((b"c", "s"))
        if entry is not None and entry.payload.text.waiting_since is not None:
            break
    job = entry.payload
    made = job.member.frames
    assert made > 2 and pending  # its last frame's window was decoding when the iteration began
    assert not loop.core.pending and loop.counters.steps == steps  # it came out of a step with no member
    for _ in range(3):
        loop.iteration()
    assert job.member.frames == made and loop.counters.steps == steps
    audio = [m for _, m in replies if isinstance(m, wire.Audio)]
    assert job.samples_sent == made * loop.core.artifact.samples_per_frame == sum(m.samples for m in audio)
    loop.inbox.put(MoreText(b"c", "s", " and the rest.", final=True))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert len(done) == 1 and done[0].report["audio_ms"] == done[0].report["frames"] * 80
    loop.close()
    loop.core.close()


class HeldSpeaker:
    """A speaker that plays nothing until `drain()`: the real `Reply` over the real `PcmRing`, and
    `write` refusing what does not fit, as `edged.audio.speaker.Speaker.write` does (the loop must
    pause a reply before its buffer overflows)."""

    available = True

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.replies: list = []

    def can_begin(self) -> bool:
        return True

    def begin(self, key, id):
        from edged.audio.ring import PcmRing
        from edged.audio.speaker import Reply

        self.replies.append(Reply(key, id, PcmRing(self.capacity)))
        return self.replies[-1]

    def room(self, reply) -> int:
        return reply.buffer.free()

    def write(self, reply, pcm) -> None:
        if reply.buffer.write(pcm) < len(pcm):
            raise RuntimeError(f"speaker buffer overflow for {reply.id!r}")

    def end(self, reply) -> None:
        reply.ended = True

    def stop(self, reply) -> None:
        reply.stopped = True

    def status(self) -> dict:
        return {}

    def drain(self) -> None:
        for reply in self.replies:
            reply.played += reply.buffer.discard(reply.buffer.available())


@pytest.mark.parametrize("vocoder_threads", [0, 1])
def test_a_reply_pauses_before_its_speaker_buffer_overflows(builtin_artifact, backend, vocoder_threads):
    """A step can hand a reply two windows when the vocoder has a thread of its own (the one decoded
    while it computed, and the tail): the loop steps a member only while its buffer takes that much.
    Ten frames, windows of 1, 4, 4 and 1 frames, into a buffer of 18000 samples that nothing plays
    until the member pauses: after the first two windows 8400 samples are free, which one window
    (7680) fits, and the last two, handed out by one step (9600), do not."""
    spf = 1920
    speaker = HeldSpeaker(18000)
    loop, replies = make_loop(builtin_artifact, backend, vocoder_threads, speaker=speaker)
    loop.inbox.put(Submit(b"c", SpeechRequest("r", "Ten frames, held.", sampling=Sampling.greedy(), max_frames=10),
                          play=True))
    for _ in range(40):
        loop.iteration()
    reply = speaker.replies[0]
    assert not reply.ended and reply.buffer.available() >= 5 * spf  # paused
    speaker.drain()
    for _ in range(40):
        loop.iteration()
        speaker.drain()
        if reply.ended:
            break
    assert reply.ended and reply.played == 10 * spf
    loop.inbox.put(PlaybackEnded(reply))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert [(d.id, d.reason, d.report["frames"]) for d in done] == [("r", "length", 10)]
    loop.core.close()


def test_a_failing_prepare_fails_that_request_only(builtin_artifact, backend, monkeypatch):
    loop, replies = make_loop(builtin_artifact, backend)
    real = loop.core.prepare

    def prepare(request, slot, streamed=None):
        if request.id == "boom":
            raise RuntimeError("injected failure")
        return real(request, slot, streamed)

    monkeypatch.setattr(loop.core, "prepare", prepare)
    loop.inbox.put(Submit(b"c", SpeechRequest("ok", "Fine.", max_frames=4), play=False))
    loop.inbox.put(Submit(b"c", SpeechRequest("boom", "Breaks.", max_frames=4), play=False))
    run_until_idle(loop)
    done = {m.id: m for _, m in replies if isinstance(m, wire.Done)}
    assert done["ok"].reason == "length" and done["ok"].report["frames"] == 4
    assert done["boom"].reason == "error" and "injected failure" in done["boom"].error


@pytest.mark.parametrize("vocoder_threads", [0, 1])
def test_an_engine_failure_during_a_step_fails_that_cohort_step_and_the_loop_goes_on(builtin_artifact, backend,
                                                                                    monkeypatch, vocoder_threads):
    """A step that raises ends the members it was stepping with `done` error "engine step failed:
    ...", each exactly once; the next request is served as if nothing happened."""
    loop, replies = make_loop(builtin_artifact, backend, vocoder_threads)
    real, calls = loop.core.step, {"n": 0}

    def step(members):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected engine failure")
        return real(members)

    monkeypatch.setattr(loop.core, "step", step)
    for id in ("a", "b"):
        loop.inbox.put(Submit(b"c", SpeechRequest(id, "Stepped together.", max_frames=40), play=False))
    run_until_idle(loop)
    loop.inbox.put(Submit(b"c", SpeechRequest("after", "Served after the failure.", max_frames=4), play=False))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert sorted(m.id for m in done) == ["a", "after", "b"]  # exactly one done each
    by_id = {m.id: m for m in done}
    for id in ("a", "b"):
        assert by_id[id].reason == "error" and by_id[id].error == "engine step failed: injected engine failure"
        assert by_id[id].report["frames"] == 2
    assert by_id["after"].reason == "length" and by_id["after"].report["frames"] == 4
    loop.core.close()


def test_the_loop_imports_no_protocol_or_audio_code():
    """The loop is handed its clients, speaker and history: importing it (and everything it
    imports) loads no protocol, socket or audio device module."""
    import subprocess
    import sys

    probe = ("import sys, edged.scheduler.loop; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('zmq', 'sounddevice', 'msgpack', 'torch') "
             "or m.startswith(('edged.protocol', 'edged.audio', 'edged.server', 'edged.history'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
