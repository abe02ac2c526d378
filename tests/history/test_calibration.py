"""The history owner and its calibration component, driven through the scenarios of the seed design
(vllm-omni's duplex history calibration): real SQLite, the real history thread, replies read from
its real ZeroMQ pipe; policies are small functions the tests control."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from support.history import CLIENT, RATE, SECONDS, TEXT, Rig

from edged import protocol as wire
from edged.history.calibration import Calibration, Evidence, Snapshot
from edged.history.service import AddTurn, Query
from edged.history.store import Store


@dataclass
class Scripted:
    """A policy whose answer, delay and failure the test sets; it records every snapshot."""

    answer: Callable[[Snapshot], int | None] = lambda s: len("Hello")
    requires_audio: bool = True
    name: str = "scripted"
    calls: list[Snapshot] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def calibrate(self, snapshot: Snapshot) -> int | None:
        self.calls.append(snapshot)
        self.gate.wait(10)
        return self.answer(snapshot)


@pytest.fixture
def rig(tmp_path):
    made = []

    def make(policy, **kwargs) -> Rig:
        made.append(Rig(tmp_path / str(len(made)), policy, **kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close()


# --------------------------------------------------------------------------------------- retention


def test_eviction_keeps_whole_replies_under_the_byte_bound():
    policy = Scripted()
    cal = Calibration(policy, lambda done: None, max_bytes=16)
    for i in range(40):
        cal.retain("s", f"r{i}", np.zeros(2, np.float32), RATE)  # 8 bytes each
        assert cal.retained_bytes("s") <= 16
    assert list(cal.audio["s"]) == ["r38", "r39"]
    cal.retain("s", "big", np.zeros(5, np.float32), RATE)  # 20 bytes: never kept, never as a suffix
    assert list(cal.audio["s"]) == ["r38", "r39"]
    evidence = Evidence("r0", "s", "r0", TEXT, 1000, None, None)
    assert not cal.start(evidence)  # an evicted reply has no audio: the default stays
    assert not policy.calls
    cal.close()


def test_a_text_only_policy_keeps_no_audio_and_shares_the_fences(rig):
    policy = Scripted(requires_audio=False)
    r = rig(policy, max_bytes=1)
    r.speak("a")
    r.end("a")
    r.ack("a", 1000, final=True)
    turn = r.assistant(wait=True)
    assert turn == {"role": "assistant", "content": "Hello", "interrupted": True, "response_id": "a"}
    (snapshot,) = policy.calls
    assert snapshot.pcm is None and snapshot.sample_rate == 0 and snapshot.played_ms == 1000
    assert snapshot.complete_ms == SECONDS * 1000 and snapshot.text == TEXT
    assert r.history.snapshot["retained_bytes"] == 0


def test_the_prompt_waits_for_the_heard_prefix_in_its_original_position(rig):
    policy = Scripted()
    policy.gate.clear()
    r = rig(policy)
    r.send(AddTurn(CLIENT, wire.Turn("s", "user", "Say something.")))
    r.speak("a")
    r.send(AddTurn(CLIENT, wire.Turn("s", "user", "Stop!")))  # the user barged in
    r.end("a", reason="cancelled", played_ms=None)
    r.ack("a", 1000, final=True)
    threading.Timer(0.3, policy.gate.set).start()
    t0 = time.monotonic()
    turns = r.ask(wait=True)
    assert time.monotonic() - t0 >= 0.25  # it waited for the run
    assert turns == [{"role": "user", "content": "Say something."},
                     {"role": "assistant", "content": "Hello", "interrupted": True, "response_id": "a"},
                     {"role": "user", "content": "Stop!"}]


def test_a_stricter_truncation_clears_the_prefix_and_a_later_full_ack_cannot_restore_it(rig):
    policy = Scripted(answer=lambda s: len("Hello") if s.played_ms >= 1000 else None)
    r = rig(policy)
    r.speak("a")
    r.end("a")
    r.ack("a", 1000, final=True)
    assert r.assistant(wait=True)["content"] == "Hello"
    r.ack("a", 500, final=True)  # stricter: the policy keeps the default for it
    assert r.assistant(wait=True)["content"] == ""
    r.ack("a", SECONDS * 1000, final=True)  # a late full ack
    r.ack("a", SECONDS * 1000)
    assert r.assistant(wait=True) == {"role": "assistant", "content": "", "interrupted": True, "response_id": "a"}
    assert [s.played_ms for s in policy.calls] == [1000, 500]


@pytest.mark.parametrize("failure", ["timeout", "exception", "out of range", "not an int"])
def test_a_failed_run_keeps_the_default_and_is_not_retried_on_the_same_evidence(rig, failure):
    def answer(snapshot):
        if failure == "timeout":
            time.sleep(0.3)
            return 5
        if failure == "exception":
            raise RuntimeError("boom")
        return len(TEXT) + 1 if failure == "out of range" else True

    policy = Scripted(answer=answer)
    r = rig(policy, timeout_s=0.1)
    r.speak("a")
    r.end("a", reason="cancelled")
    r.ack("a", 1000, final=True)
    assert r.assistant(wait=True)["content"] == ""
    time.sleep(0.4)  # a timed-out run's late result arrives now, and is refused
    assert r.assistant(wait=True)["content"] == ""
    r.ack("a", 1000, final=True)  # the same evidence again
    assert r.assistant(wait=True)["content"] == ""
    assert len(policy.calls) == 1


def test_a_closed_session_never_gets_a_late_result(rig):
    policy = Scripted()
    policy.gate.clear()
    r = rig(policy)
    r.speak("a")
    r.end("a", reason="cancelled")
    r.ack("a", 1000, final=True)
    r.settle()
    assert len(policy.calls) == 1
    r.send(Query(CLIENT, wire.History("s", close=True)))  # releases the reply's cursor, audio and run
    r.pull.recv_multipart()
    policy.gate.set()
    r.settle()
    assert r.assistant()["content"] == "" and r.history.snapshot["calibrating"] == 0
    assert r.history.snapshot["retained_bytes"] == 0


def test_periodic_acks_never_start_work(rig):
    policy = Scripted()
    r = rig(policy)
    r.speak("a")
    for ms in (2000, 3000, 4000):
        r.ack("a", ms)
    r.end("a")
    for ms in (5000, 6000):
        r.ack("a", ms)
    r.settle()
    assert not policy.calls and r.history.snapshot["calibrating"] == 0
    assert r.assistant() == {"role": "assistant", "content": "", "interrupted": True, "response_id": "a"}
    r.ack("a", SECONDS * 1000, final=True)  # played to the end of a complete reply: the whole text
    assert r.assistant() == {"role": "assistant", "content": TEXT, "interrupted": False, "response_id": "a"}
    assert not policy.calls and r.history.snapshot["retained_bytes"] == 0


def test_the_prompt_deadline_revokes_a_late_result(rig):
    policy = Scripted()
    policy.gate.clear()
    r = rig(policy, timeout_s=5.0, wait_s=0.2)
    r.speak("a")
    r.end("a", reason="cancelled")
    r.ack("a", 1000, final=True)
    t0 = time.monotonic()
    assert r.assistant(wait=True)["content"] == ""  # answered at the prompt's deadline
    assert 0.15 < time.monotonic() - t0 < 2.0
    policy.gate.set()  # the run returns 5 now: too late, its task lost ownership
    r.settle()
    assert r.assistant(wait=True)["content"] == "" and len(policy.calls) == 1


def test_newer_evidence_replaces_a_running_task_and_the_old_result_is_refused(rig):
    def answer(snapshot):
        if snapshot.played_ms == 3000:
            time.sleep(0.3)
            return len("Hello world. This")  # late and for stale evidence
        return len("Hello")

    policy = Scripted(answer=answer)
    r = rig(policy)
    r.speak("a")
    r.end("a", reason="cancelled")
    r.ack("a", 3000, final=True)
    time.sleep(0.05)
    r.ack("a", 1000, final=True)  # stricter evidence while the first run is still going
    assert r.assistant(wait=True)["content"] == "Hello"
    time.sleep(0.4)
    assert r.assistant()["content"] == "Hello"
    assert [s.played_ms for s in policy.calls] == [3000, 1000]


def test_a_reply_played_locally_ignores_client_acks_and_uses_the_speaker(rig):
    policy = Scripted(requires_audio=False)
    r = rig(policy)
    r.speak("a", local=True)
    r.ack("a", 9000, final=True)  # ignored: the daemon's own speaker is the evidence
    r.end("a", reason="interrupted", played_ms=1000)
    assert r.assistant(wait=True)["content"] == "Hello"
    assert [s.played_ms for s in policy.calls] == [1000]


def test_unfinished_replies_after_a_crash_are_kept_as_unheard(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    store.append("s", "user", "hi")
    store.append("s", "assistant", "", original=TEXT, response_id=7, pending=True)
    store.close()  # the daemon died here
    r = Rig(tmp_path, Scripted())
    try:
        assert r.ask() == [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "", "interrupted": True, "response_id": 7}]
    finally:
        r.close()
