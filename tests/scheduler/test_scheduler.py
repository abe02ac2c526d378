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
    s.finish(entries[0], "eos")
    assert entries[0].status is Status.FINISHED_EOS and entries[0].status.reason == "eos"
    assert [(e.key, e.slot) for e in s.join()] == [("c", 0)]  # the freed slot, at once


def test_duplicate_key_in_flight_only():
    s = Scheduler(max_batch=1, queue_limit=4)
    first = Entry("x")
    assert s.submit(first) is None
    assert s.submit(Entry("x")) == "duplicate id in flight"
    s.join()
    s.finish(first, "length")
    assert s.submit(Entry("x")) is None


def test_cancel_waiting_finishes_at_once_running_at_the_boundary():
    s = Scheduler(max_batch=1, queue_limit=4)
    running, waiting = Entry("r"), Entry("w")
    s.submit(running), s.submit(waiting)
    s.join()
    assert s.cancel("w").status is Status.FINISHED_CANCELLED and not s.waiting
    assert s.cancel("r").status is Status.RUNNING and running.cancel_requested
    s.finish(running, "cancelled")
    assert running.status.finished and not s.running and not s.by_key
    assert s.cancel("gone") is None


def test_finishing_twice_is_a_bug():
    s = Scheduler(max_batch=1, queue_limit=1)
    e = Entry("a")
    s.submit(e)
    s.join()
    s.finish(e, "eos")
    with pytest.raises(AssertionError):
        s.finish(e, "error")


def test_status_order():
    assert Status.WAITING < Status.RUNNING < Status.FINISHED_EOS
    assert [s.reason for s in Status if s.finished] == ["eos", "length", "cancelled", "interrupted", "error"]
