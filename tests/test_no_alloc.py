"""Nothing allocates on the step path: tracemalloc over steady-state frames of a full cohort.

tracemalloc sees every Python object and every numpy buffer (numpy reports its data allocations
to it). Over 120 steady-state frames of 4 members, talker + code predictor + vocoder, the traced
memory may not grow by more than 1 KiB (no per-frame retention: what does grow is counters whose
values pass Python's cache of small ints and become objects, a few dozen bytes each; each source
file's growth counts on its own, so one file's frees cannot hide another's leak), and within any
one frame its peak may not rise more than 3 KiB above where the frame started (no per-frame
arrays: one noise row alone is 12 KiB, one vocoder window of PCM 7.5 KiB per frame). These are the
bounds docs/architecture.md claims.

Growth leaves out what onnxruntime's own Python binding allocates inside `run_with_iobinding`: it
keeps a pool of small (124-byte) objects that it replaces as it runs, and depending on where in
that cycle tracing starts, the pool shows a few KiB of growth that then stops (measured with
tracemalloc tracebacks). The per-frame peak still counts it.

No full collection of the cyclic collector runs while frames are traced; its young collections do,
as in the daemon. A full collection empties the interpreter's free lists (of floats, tuples,
dicts, ...), and the frames after it take those objects from the allocator again: with a
`gc.collect()` between two frames, the next frame peaked at 3992 B where its neighbours peaked at
1856 B. That is the interpreter's, once per full collection, and when one comes depends on
everything the process allocated before (a test worker's earlier modules), so it broke the peak
bound by chance.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace

import pytest

from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest

STEADY_FRAMES = 120
GROWTH_BOUND = 1024
PEAK_BOUND = 3072
NO_FULL_COLLECTION = 2**31 - 1
"""The cyclic collector's third threshold while frames are traced: its young collections go on."""


LEAVE_OUT = [tracemalloc.Filter(False, "*/onnxruntime/*"), tracemalloc.Filter(False, tracemalloc.__file__)]
"""onnxruntime's binding's pool of small objects (module docstring), and tracemalloc's own."""


def growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> int:
    """Bytes traced more in `after` than in `before`, outside onnxruntime's binding and tracemalloc:
    the sum of every source file's growth (a file whose traced memory shrank counts 0)."""
    diffs = after.filter_traces(LEAVE_OUT).compare_to(before.filter_traces(LEAVE_OUT), "filename")
    return sum(max(0, d.size_diff) for d in diffs)


def steady_peak(frame) -> int:
    """Run STEADY_FRAMES frames; the most any one of them raised the traced memory above its start."""
    worst = 0
    for _ in range(STEADY_FRAMES):
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        frame()
        worst = max(worst, tracemalloc.get_traced_memory()[1] - current)
    return worst


def traced(frame, warm_up: int = 20) -> tuple[int, int]:
    """Warm up, then trace STEADY_FRAMES frames: (growth, the worst per-frame peak), with no full
    collection among them (module docstring)."""
    for _ in range(warm_up):  # first windows, text track running out, caches of the engines
        frame()
    thresholds = gc.get_threshold()
    gc.set_threshold(*thresholds[:2], NO_FULL_COLLECTION)
    tracemalloc.start()
    try:
        for _ in range(5):  # traced warm-up: per-member counters now live in traced objects
            frame()
        before = tracemalloc.take_snapshot()
        peak = steady_peak(frame)
        return growth(before, tracemalloc.take_snapshot()), peak
    finally:
        tracemalloc.stop()
        gc.set_threshold(*thresholds)


@pytest.mark.parametrize("window,vocoder_threads", [(0, 0), (4, 0), (0, 1)])
def test_step_path_does_not_allocate(builtin_artifact, backend, window, vocoder_threads):
    """With and without the code predictor's speculative verify; with the vocoder inline and on a
    thread of its own (tracemalloc traces every thread)."""
    core = Core(load_artifact(builtin_artifact), backend, vocoder_threads=vocoder_threads)
    core.preallocate()
    requests = [
        SpeechRequest("greedy", "A greedy member of the cohort.", voice="vivian", sampling=Sampling.greedy()),
        SpeechRequest("sampled", "A sampled member, seeded.", voice="ryan", sampling=Sampling(seed=1)),
        SpeechRequest("stream", "The dual track feeds one token per frame.", dual_track=True, sampling=Sampling(seed=2)),
        SpeechRequest("plain", "No voice and no language.", sampling=Sampling.greedy()),
    ]
    requests = [replace(r, sampling=replace(r.sampling, cp_spec_verify_size=window)) for r in requests]
    members = [core.prepare(r, slot) for slot, r in enumerate(requests)]
    assert all(m.window == window for m in members)
    paused = members[:1] + members[2:]  # every few frames slot 1 sits out, inside the batch

    def frame() -> None:
        core.step(members if members[0].frames % 4 else paused)

    grown, peak = traced(frame)
    core.close()
    assert members[0].frames == 25 + STEADY_FRAMES and members[1].frames < members[0].frames
    print(f"growth {grown} B, peak {peak} B in a frame, over {STEADY_FRAMES} frames")
    assert grown <= GROWTH_BOUND, f"traced memory grew by {grown} bytes over {STEADY_FRAMES} frames"
    assert peak <= PEAK_BOUND, f"a step allocated {peak} bytes at its peak"


@pytest.mark.parametrize("vocoder_threads", [0, 1])
def test_the_cohort_loop_with_recording_does_not_allocate(builtin_artifact, backend, vocoder_threads):
    """The daemon's loop around the stages: commands, the scheduler, the PCM sink with the history
    recorder (the asr policy's per-slot buffers) writing every window; the vocoder inline and on a
    thread of its own."""
    from edged.history.recorder import Recorder
    from edged.scheduler.commands import Submit
    from edged.scheduler.loop import CohortLoop
    from edged.server.replies import ClientReplies

    artifact = load_artifact(builtin_artifact)
    recorder = Recorder(artifact.max_batch, 30 * artifact.sample_rate)
    core = Core(artifact, backend, vocoder_threads=vocoder_threads)
    core.preallocate()
    clients = ClientReplies(lambda *_: None, artifact.sample_rate, core.window_samples)
    loop = CohortLoop(core, clients, recorder=recorder)
    for i in range(artifact.max_batch):
        request = SpeechRequest(f"r{i}", "A member of the cohort, recorded for calibration.", sampling=Sampling.greedy(),
                                max_frames=400)
        loop.inbox.put(Submit(b"c", request, play=False, session="s", stream=i % 2 == 0, format=("f32le", "s16le")[i // 2]))
    grown, peak = traced(loop.iteration, warm_up=30)  # joins, first windows
    core.close()
    assert loop.counters.steps == 35 + STEADY_FRAMES and len(loop.scheduler.running) == artifact.max_batch
    assert all(n > 0 for n in recorder.samples)
    print(f"loop: growth {grown} B, peak {peak} B in a frame, over {STEADY_FRAMES} frames")
    assert grown <= GROWTH_BOUND and peak <= PEAK_BOUND, (grown, peak)


def test_a_streaming_member_that_waits_and_resumes_does_not_allocate(builtin_artifact, backend):
    """A member whose text comes one token every third frame (slower than it speaks) waits at most
    boundaries and resumes when a token arrives, beside members that never wait."""
    from edged.talker.text import Streamed

    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    stream = core.text_stream()
    ids = stream.feed("A streamed reply, read one token at a time beside the others, and never early. " * 3,
                      final=True)
    assert len(ids) > 60
    streaming = core.prepare(SpeechRequest("s", "", sampling=Sampling.greedy(), more_text=True),
                             0, Streamed(stream.head, tuple(ids[:2]), False))
    others = [core.prepare(SpeechRequest(f"o{i}", "A member that never waits.", sampling=Sampling(seed=i)), slot)
              for i, slot in enumerate((1, 2, 3))]
    members = [streaming, *others]
    state = {"frame": 0, "fed": 2, "waited": 0}

    def frame() -> None:
        if state["frame"] % 3 == 0:
            core.extend_text(streaming, ids[state["fed"]:state["fed"] + 1], False)
            state["fed"] += 1
        state["frame"] += 1
        ready = [m for m in members if core.ready(m)]
        state["waited"] += len(ready) < len(members)
        core.step(ready)

    grown, peak = traced(frame)
    assert streaming.frames < others[0].frames == 25 + STEADY_FRAMES and state["waited"] > 50
    assert streaming.frames >= state["fed"] - 3  # it resumed every time a token came
    print(f"streaming: growth {grown} B, peak {peak} B in a frame, over {STEADY_FRAMES} frames")
    assert grown <= GROWTH_BOUND and peak <= PEAK_BOUND, (grown, peak)


def test_an_omni_cohort_does_not_allocate(omni_artifacts, backend):
    """The same bounds for a Qwen3-Omni cohort: the MoE talker, the segments layout with user turns,
    the code2wav's streams that start with samples the host drops."""
    import pytest

    pytest.importorskip("transformers")
    core = Core(load_artifact(omni_artifacts(0, 20)[1]), backend)  # the session's tiny Omni artifact
    core.preallocate()
    turns = (("system", "Be brief."), ("user", "Is it December?"))
    requests = [
        SpeechRequest("greedy", "Yes, it is the end of the year.", voice="ethan", sampling=Sampling.greedy(), context=turns),
        SpeechRequest("sampled", "A sampled member, seeded.", voice="aiden", sampling=Sampling(seed=1)),
        SpeechRequest("chelsie", "Another voice.", voice="chelsie", sampling=Sampling(seed=2), context=turns[1:]),
        SpeechRequest("default", "The default speaker.", sampling=Sampling.greedy()),
    ]
    members = [core.prepare(r, slot) for slot, r in enumerate(requests)]

    def frame() -> None:
        core.step([m for m in members if m.outcome.value == "running"])

    grown, peak = traced(frame)
    assert all(m.frames == 25 + STEADY_FRAMES for m in members), [m.frames for m in members]
    print(f"omni: growth {grown} B, peak {peak} B in a frame, over {STEADY_FRAMES} frames")
    assert grown <= GROWTH_BOUND, f"traced memory grew by {grown} bytes over {STEADY_FRAMES} frames"
    assert peak <= PEAK_BOUND, f"a step allocated {peak} bytes at its peak"


ADMISSION_GROWTH_BOUND = 1024
ADMISSION_PEAK_BOUND = 64 * 1024


def test_admission_retains_nothing(builtin_artifact, backend):
    """Admission is not the step path: it tokenizes, lays out the prompt and binds the prefill for
    its length (a plan per prompt length, the last PREFILL_PLANS lengths kept), all transient.
    Rounds of 8 requests (voices, lengths, greedy and sampled, streamed and whole replies, f32le and
    s16le) run through the loop until it is idle again; after a traced warm-up, the traced memory
    at idle (outside onnxruntime's binding, as above) may not grow by more than 1 KiB over 320 more
    admissions, in each of three such windows, each source file's growth counted on its own (a file
    that shrank counts 0, so it cannot hide another's growth; a retained object per admission would
    be >= 9 KiB), and no iteration, admitting or not, may peak more than 64 KiB above where it
    started. These are the bounds docs/architecture.md claims."""
    import logging

    from edged.scheduler.commands import Submit
    from edged.scheduler.loop import CohortLoop
    from edged.server.replies import ClientReplies

    artifact = load_artifact(builtin_artifact)
    core = Core(artifact, backend)
    core.preallocate()
    loop = CohortLoop(core, ClientReplies(lambda *_: None, artifact.sample_rate, core.window_samples))
    texts = ("Short one.", "A somewhat longer sentence for the cohort.", "Third text, with commas, and more words to read.")
    voices = (None, "vivian", "ryan")
    admitted = [0]

    def round_of_8() -> int:
        for i in range(8):
            sampling = Sampling(seed=i) if i % 2 else Sampling.greedy()
            request = SpeechRequest(f"r{admitted[0]}", texts[i % 3], voice=voices[i % 3], sampling=sampling,
                                    max_frames=6 + i)
            loop.inbox.put(Submit(b"c", request, play=False, session=None, stream=i % 2 == 0,
                                  format=("f32le", "s16le")[i // 4]))
            admitted[0] += 1
        worst = 0
        while loop.scheduler.by_key or not loop.inbox.empty():
            current, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            loop.iteration()
            worst = max(worst, tracemalloc.get_traced_memory()[1] - current)
        return worst

    def idle() -> tracemalloc.Snapshot:
        gc.collect()  # also empties the interpreter's free lists
        return tracemalloc.take_snapshot().filter_traces(LEAVE_OUT)

    for _ in range(10):
        round_of_8()
    logging.disable(logging.INFO)  # pytest keeps every log record of a test in memory
    tracemalloc.start()
    try:
        for _ in range(40):
            round_of_8()
        before = idle()  # (also compiles the filters' patterns, which fnmatch caches)
        before = idle()
        growths, peak = [], 0
        for _ in range(3):  # a retained object per admission grows every window; allocator noise does not
            peak = max(peak, *(round_of_8() for _ in range(40)))
            after = idle()
            growths.append(growth(before, after))
            before = after
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)
    assert admitted[0] == 170 * 8 and loop.counters.steps > 170 * 6
    print(f"admission: growth {growths} B over three windows of 320 admissions, peak {peak} B in an iteration")
    assert max(growths) <= ADMISSION_GROWTH_BOUND, f"traced memory at idle grew by {growths} B in windows of 320 admissions"
    assert peak <= ADMISSION_PEAK_BOUND, f"an iteration allocated {peak} bytes at its peak"
