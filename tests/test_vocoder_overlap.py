"""The vocoder on a thread of its own (`Core(vocoder_threads=1)`) against decoding inline:

1. the same frames and the same windows, bit for bit: each window a step or more later than inline,
   no later than the step that stages its slot's next window or ends its member, in its slot's
   order, but a stream's first and last in the same step as inline (first audio is not delayed; a
   member's last window comes out with its finish), numbered the same (first_sample); a step that
   stages no window does not wait for the worker;
2. a window handed out stays valid until its slot's next one, even once the worker has decoded
   the slot's next window;
3. a stopped member's window still decoding is never handed out, not even to the member that takes
   its slot next;
4. an error in the worker fails the step that collects it, and the worker goes on;
5. the thread stops on close; a TensorRT backend keeps the vocoder on the step thread.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.core import Core
from edged.request import Sampling, SpeechRequest

REQUESTS = [
    SpeechRequest("a", "The first member of the cohort.", voice="vivian", sampling=Sampling(seed=1), max_frames=23),
    SpeechRequest("b", "A greedy second one.", voice="ryan", sampling=Sampling.greedy(), max_frames=9),
    SpeechRequest("c", "A third, on the dual track.", dual_track=True, sampling=Sampling(seed=3), max_frames=14),
    SpeechRequest("d", "Fourth, short.", sampling=Sampling.greedy(), max_frames=6),
    SpeechRequest("e", "The fifth takes the first slot that frees.", voice="aiden", sampling=Sampling(seed=5),
                  max_frames=17),
]


def make_core(artifact_dir, backend, threads: int, chunk: int = 4, first: int = 1) -> Core:
    core = Core(load_artifact(artifact_dir), backend, vocoder_threads=threads, chunk_frames=chunk,
                first_chunk_frames=first)
    core.preallocate()
    return core


def drive(core: Core, check=None) -> tuple[list[list[tuple]], dict[str, np.ndarray]]:
    """Four members, a fifth in the first slot that frees, to their ends. Per step, the windows
    handed out as (request id, first_sample, first, last, samples copied); and each request's frames.
    `check(out, ids)` runs after each step (ids: each slot's request id)."""
    waiting = list(REQUESTS[4:])
    members = {slot: core.prepare(r, slot) for slot, r in enumerate(REQUESTS[:4])}
    ids = {slot: m.request.id for slot, m in members.items()}
    log, frames = [], {}
    while members:
        out = core.step(list(members.values()))
        if check is not None:
            check(out, ids)
        log.append([(ids[w.slot], w.first_sample, w.first, w.last, w.samples.copy()) for w in out.windows])
        for m in out.finished:
            frames[m.request.id] = core.frames(m).copy()
            core.stop(m)
            del members[m.slot]
            if waiting:
                members[m.slot] = core.prepare(waiting.pop(0), m.slot)
                ids[m.slot] = members[m.slot].request.id
    assert not core.pending
    return log, frames


@pytest.mark.parametrize("chunk,first", [(4, 1), (1, 1), (3, 2)])
def test_the_same_windows_later_but_first_and_last(builtin_artifact, backend, chunk, first):
    inline, inline_frames = drive(make_core(builtin_artifact, backend, 0, chunk, first))
    core = make_core(builtin_artifact, backend, 1, chunk, first)
    try:
        overlapped, frames = drive(core)
    finally:
        core.close()
    assert frames.keys() == inline_frames.keys() == {r.id for r in REQUESTS}
    for id, want in inline_frames.items():
        assert np.array_equal(frames[id], want), id
    assert len(overlapped) == len(inline)
    at = {(w[0], w[1]): (step, w) for step, windows in enumerate(inline) for w in windows}
    got = {(g[0], g[1]): (step, g) for step, windows in enumerate(overlapped) for g in windows}
    assert got.keys() == at.keys() and sum(map(len, overlapped)) == len(at)
    for key, (step, w) in at.items():
        # the step that stages the slot's next window (or its last): the latest this one may come out
        deadline = min((s for (id, first_sample), (s, _) in at.items() if id == key[0] and first_sample > key[1]),
                       default=step)
        out, g = got[key]
        if w[2] or w[3]:
            assert out == step, f"{key}: first or last at step {out}, inline {step}"
        else:
            assert step < out <= deadline, f"{key}: at step {out}, inline {step}, next {deadline}"
        assert w[2:4] == g[2:4] and np.array_equal(w[4], g[4]), key
    for id in {key[0] for key in at}:
        order = [g[1] for windows in overlapped for g in windows if g[0] == id]
        assert order == sorted(order), id
    later = sum(not (w[2] or w[3]) for windows in inline for w in windows)
    assert later > len(REQUESTS), "too few windows decode while a step computes"


def test_a_step_that_stages_no_window_does_not_wait_for_the_worker(builtin_artifact, backend):
    """A window takes the vocoder about as long as the frames it holds take generation: the steps
    between two windows of a slot go on while the worker decodes, and the step that stages the
    next waits for it. (The worker is held on a gate; a step that waited would only return once
    the safety timer opened it.)"""
    core = make_core(builtin_artifact, backend, 1, chunk=4, first=1)
    gate, fill, timed_out = threading.Event(), core.worker.fill, []

    def gated(window) -> None:
        if not (window.first or window.last):
            gate.wait()
        fill(window)

    core.worker.fill = gated
    safety = threading.Timer(60, lambda: (timed_out.append(True), gate.set()))
    safety.start()
    try:
        member = core.prepare(REQUESTS[0], 0)
        handed = [len(core.step([member]).windows) for _ in range(5)]  # frame 1: the first; 2..5: one window
        assert handed == [1, 0, 0, 0, 0] and core.pending
        handed = [len(core.step([member]).windows) for _ in range(3)]  # frames 6..8: nothing staged, no wait
        assert handed == [0, 0, 0] and core.pending and not core.worker.done() and not timed_out
        gate.set()
        out = core.step([member])  # frame 9 stages the next window: the one decoding comes out first
        assert [w.first_sample for w in out.windows] == [core.artifact.samples_per_frame - core.artifact.lead_samples]
        assert core.pending and not timed_out
    finally:
        safety.cancel()
        gate.set()
        core.close()


@pytest.mark.parametrize("chunk,first", [(4, 1), (1, 1)])
def test_a_window_stays_valid_until_its_slots_next_one(builtin_artifact, backend, chunk, first):
    """After every step the worker is made to finish the windows it was handed (the slots' next
    ones, into their other buffers) before the windows handed out are read: each still holds what
    inline decoding made, and so does every slot's latest window from earlier steps."""
    reference, _ = drive(make_core(builtin_artifact, backend, 0, chunk, first))
    made = {(w[0], w[1]): w[4] for windows in reference for w in windows}
    core = make_core(builtin_artifact, backend, 1, chunk, first)
    latest: dict[int, tuple[str, int, np.ndarray]] = {}
    checked = [0]

    def check(out, ids) -> None:
        core.worker.wait()  # the next windows are decoded now
        handed = [(ids[w.slot], w.first_sample, w.samples) for w in out.windows]
        for w in out.windows:
            latest[w.slot] = (ids[w.slot], w.first_sample, w.samples)
        for id, first_sample, samples in [*handed, *latest.values()]:
            assert np.array_equal(samples, made[(id, first_sample)]), f"{id} at {first_sample} was overwritten"
            checked[0] += 1

    try:
        drive(core, check)
    finally:
        core.close()
    assert checked[0] > 50


def test_a_stopped_members_window_is_dropped(builtin_artifact, backend):
    """A member stopped while a window of its decodes: no later step hands that window out, and the
    request that takes its slot gets exactly its own windows."""
    core = make_core(builtin_artifact, backend, 1)
    try:
        member = core.prepare(REQUESTS[0], 0)
        while not core.pending:
            core.step([member])
        core.stop(member)
        assert core.step([]).windows == [] and not core.pending
        member = core.prepare(REQUESTS[0], 0)
        while not core.pending:
            core.step([member])
        core.stop(member)  # and this time the slot is taken again at once
        newcomer = core.prepare(REQUESTS[3], 0)
        got = []
        while newcomer.outcome.value == "running":
            got += [(w.first_sample, w.samples.copy()) for w in core.step([newcomer]).windows]
    finally:
        core.close()
    alone, _ = drive_one(make_core(builtin_artifact, backend, 0), REQUESTS[3])
    assert [g[0] for g in got] == [a[0] for a in alone] and got[0][0] == 0
    assert all(np.array_equal(g[1], a[1]) for g, a in zip(got, alone))


def drive_one(core: Core, request: SpeechRequest) -> tuple[list[tuple[int, np.ndarray]], np.ndarray]:
    member = core.prepare(request, 0)
    windows = []
    while member.outcome.value == "running":
        windows += [(w.first_sample, w.samples.copy()) for w in core.step([member]).windows]
    return windows, core.frames(member).copy()


def test_an_error_in_the_worker_fails_the_step_that_collects_it(builtin_artifact, backend):
    core = make_core(builtin_artifact, backend, 1)
    fill, calls = core.worker.fill, {"n": 0}

    def failing(window) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected vocoder failure")
        fill(window)

    core.worker.fill = failing
    try:
        member = core.prepare(REQUESTS[0], 0)
        with pytest.raises(EngineError, match="vocoder: injected vocoder failure"):
            while member.outcome.value == "running":
                core.step([member])
        assert calls["n"] == 3 and not core.pending
        core.stop(member)
        windows, frames = drive_one(core, REQUESTS[1])
    finally:
        core.close()
    want, want_frames = drive_one(make_core(builtin_artifact, backend, 0), REQUESTS[1])
    assert np.array_equal(frames, want_frames) and len(windows) == len(want)
    assert all(np.array_equal(g[1], w[1]) for g, w in zip(windows, want))


def test_close_stops_the_thread(builtin_artifact, backend):
    before = {t.ident for t in threading.enumerate()}
    core = make_core(builtin_artifact, backend, 1)
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert [t.name for t in started] == ["edged-vocoder"] and core.worker.threaded
    assert core.step_samples == 2 * core.window_samples
    drive_one(core, REQUESTS[3])
    core.close()
    core.close()
    assert not started[0].is_alive()
    inline = make_core(builtin_artifact, backend, 0)
    assert not inline.worker.threaded and inline.step_samples == inline.window_samples


def test_tensorrt_keeps_the_vocoder_on_the_step_thread(monkeypatch, builtin_artifact, tmp_path):
    """One CUDA context, current on the step thread, and one stream: the vocoder's windows are
    decoded there, after each step, whatever the plan gives it."""
    from support import fake_trt

    fake_trt.install(monkeypatch)
    from edged.backends import tensorrt
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    build_plans(art, chunk_frames=4, first_chunk_frames=1)
    backend = tensorrt.TrtBackend()
    try:
        core = Core(load_artifact(art), backend, vocoder_threads=2)
        assert core.vocoder_backend is None and not core.worker.threaded and core.vocoder.backend is backend
        core.preallocate()
        windows, _ = drive_one(core, REQUESTS[3])
        assert len(windows) == 3 and not core.pending  # 1 + 4 + 1 frames, each window out of its own step
        core.close()
    finally:
        backend.close()
    assert fake_trt.stack_depth() == 0
