"""The cohort loop driven in-process: commands in, replies out, one iteration at a time."""

from __future__ import annotations

import time

from edged import protocol as wire
from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.scheduler.commands import Cancel, Drain, StatusQuery, Submit
from edged.scheduler.loop import CohortLoop
from edged.server.replies import ClientReplies


def make_loop(builtin_artifact, backend, **kwargs):
    replies = []
    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    clients = ClientReplies(lambda c, m, p: replies.append((c, m)), core.artifact.sample_rate, core.window_samples)
    return CohortLoop(core, clients, **kwargs), replies


def run_until_idle(loop, limit=2000):
    for _ in range(limit):
        loop.iteration()
        if not loop.scheduler.by_key and loop.inbox.empty():
            return
    raise AssertionError("loop did not go idle")


def test_each_accepted_request_gets_exactly_one_done(builtin_artifact, backend):
    loop, replies = make_loop(builtin_artifact, backend, queue_limit=8)
    for i in range(6):
        loop.inbox.put(Submit(b"c", SpeechRequest(f"r{i}", f"Request {i}.", max_frames=3 + i, sampling=Sampling(seed=i)),
                              play=False))
    loop.inbox.put(Submit(b"c", SpeechRequest("bad", "Hi.", voice="nobody"), play=False))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)]
    assert sorted(d.id for d in done) == [f"r{i}" for i in range(6)]
    assert {d.id: d.report["frames"] for d in done} == {f"r{i}": 3 + i for i in range(6)}
    assert [m.id for _, m in replies if isinstance(m, wire.Rejected)] == ["bad"]


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


def test_cancel_and_status(builtin_artifact, backend):
    loop, replies = make_loop(builtin_artifact, backend)
    loop.inbox.put(Submit(b"c", SpeechRequest("x", "Cancel me.", max_frames=400), play=False))
    for _ in range(5):
        loop.iteration()
    loop.inbox.put(Cancel(b"c", "x"))
    loop.inbox.put(Cancel(b"other-client", "x"))  # ids are per client: this one is unknown, ignored
    loop.inbox.put(StatusQuery(b"c"))
    run_until_idle(loop)
    done = [m for _, m in replies if isinstance(m, wire.Done)][0]
    assert done.reason == "cancelled" and done.report["frames"] == done.report["cancelled_at_frame"] == 5
    status = [m for _, m in replies if isinstance(m, wire.StatusReply)][0].fields
    assert status["cohort"]["running"] == 1 and status["counters"]["accepted"] == 1


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


def test_an_engine_failure_during_a_step_fails_that_cohort_step_and_the_loop_goes_on(builtin_artifact, backend,
                                                                                    monkeypatch):
    """A step that raises ends the members it was stepping with `done` error "engine step failed:
    ...", each exactly once; the next request is served as if nothing happened."""
    loop, replies = make_loop(builtin_artifact, backend)
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
