"""The scheduler is bookkeeping only: tested with plain values, no engines, sockets or clocks."""

from __future__ import annotations

import pytest

from edged.scheduler.scheduler import Entry, Scheduler, Status


def test_slots_queue_and_busy():
    s = Scheduler(max_batch=2, queue_limit=1)
    entries = [Entry(k) for k in "abcd"]
    assert [s.submit(e) for e in entries] == [None, None, None, "busy"]  # 2 free slots + 1 queued
    assert [e.key for e in s.join()] == ["a", "b"]
    assert [e.slot for e in s.members] == [0, 1] and s.waiting[0].key == "c"
    assert s.submit(Entry("d")) == "busy"
    s.end(entries[0], "eos")
    assert entries[0].status is Status.FINISHED_EOS and entries[0].status.reason == "eos"
    assert [(e.key, e.slot) for e in s.join()] == [("c", 0)]  # the freed slot, at once


def test_duplicate_key_in_flight_only():
    s = Scheduler(max_batch=1, queue_limit=4)
    first = Entry("x")
    assert s.submit(first) is None
    assert s.submit(Entry("x")) == "duplicate id in flight"
    s.join()
    s.end(first, "length")
    assert s.submit(Entry("x")) is None


def test_cancel_waiting_finishes_at_once_running_at_the_boundary():
    s = Scheduler(max_batch=1, queue_limit=4)
    running, waiting = Entry("r"), Entry("w")
    s.submit(running), s.submit(waiting)
    s.join()
    assert s.cancel("w").status is Status.FINISHED_CANCELLED and not s.waiting
    assert s.cancel("r").status is Status.RUNNING and running.cancel_requested
    s.end(running, "cancelled")
    assert running.status.finished and not s.running and not s.by_key
    assert s.cancel("gone") is None


def test_ending_twice_is_a_bug():
    s = Scheduler(max_batch=1, queue_limit=1)
    e = Entry("a")
    s.submit(e)
    s.join()
    s.end(e, "eos")
    with pytest.raises(AssertionError):
        s.end(e, "error")


def playing(reason: str, error: str | None = None) -> tuple[Scheduler, Entry]:
    """A reply on the local speaker whose generation ended with `reason`."""
    s = Scheduler(max_batch=1, queue_limit=1)
    e = Entry("p", plays=True)
    s.submit(e)
    s.join()
    s.end(e, reason, error)
    return s, e


def test_a_reply_on_the_speaker_plays_before_it_finishes():
    """1. Generation ends: the slot is free at once, the reply is PLAYING (still in flight).
    2. The speaker played it to its end: it finishes with the generation's reason."""
    s, e = playing("eos")
    assert e.status is Status.PLAYING and not s.running and s.by_key == {"p": e} and s.playing == {"p": e}
    assert s.submit(Entry("p")) == "duplicate id in flight"
    s.played(e, None)
    assert e.status is Status.FINISHED_EOS and not s.by_key and not s.playing


@pytest.mark.parametrize("reason,cut,final", [
    ("length", "interrupted", Status.FINISHED_INTERRUPTED),  # the user spoke over it
    ("eos", "error", Status.FINISHED_ERROR),  # the device was lost
    ("eos", "stopped", Status.FINISHED_CANCELLED),  # a cancel cut it while it played
    ("cancelled", "stopped", Status.FINISHED_CANCELLED),  # cancelled while generating: the loop cut it
    ("error", "stopped", Status.FINISHED_ERROR),  # generation failed: the loop cut it
    ("length", None, Status.FINISHED_LENGTH),  # a cancel came too late: it had played to its end
])
def test_what_the_speaker_says_decides_the_end(reason, cut, final):
    s, e = playing(reason, "engine step failed" if reason == "error" else None)
    s.played(e, cut, "audio device lost" if cut == "error" else None)
    assert e.status is final
    assert e.error == {"error": "engine step failed" if reason == "error" else "audio device lost"}.get(final.reason)


def test_a_cut_while_generating_stops_generation_with_the_cut_reason():
    """1. The user speaks while the reply is still generating: the speaker is through with it.
    2. Generation is asked to stop; at the boundary it ends, and finishes as interrupted at once."""
    s = Scheduler(max_batch=1, queue_limit=1)
    e = Entry("p", plays=True)
    s.submit(e)
    s.join()
    s.played(e, "interrupted")
    assert e.status is Status.RUNNING and e.cancel_requested and not e.plays
    s.end(e, "cancelled")
    assert e.status is Status.FINISHED_INTERRUPTED and not s.by_key


def test_status_order():
    assert Status.WAITING < Status.RUNNING < Status.PLAYING < Status.FINISHED_EOS
    assert not Status.PLAYING.finished
    assert [s.reason for s in Status if s.finished] == ["eos", "length", "cancelled", "interrupted", "error"]
