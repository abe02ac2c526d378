"""Nothing allocates on the step path: tracemalloc over steady-state frames of a full cohort.

tracemalloc sees every Python object and every numpy buffer (numpy reports its data allocations
to it). Over 120 steady-state frames of 4 members, talker + code predictor + vocoder, the traced
memory may not grow by more than 2 KiB (no per-frame retention), and its peak may not rise more
than 16 KiB above the starting point (no per-frame arrays: one noise row alone is 12 KiB, one
vocoder window of PCM 7.5 KiB per frame).
"""

from __future__ import annotations

import tracemalloc

from edged.artifact import load_artifact
from edged.request import SpeechRequest
from edged.synth import Synthesizer
from edged.talker.sampling import Sampling

STEADY_FRAMES = 120
GROWTH_BOUND = 2 * 1024
PEAK_BOUND = 16 * 1024


def test_step_path_does_not_allocate(builtin_artifact, backend):
    synth = Synthesizer(load_artifact(builtin_artifact), backend)
    talker, vocoder = synth.talker, synth.vocoder
    requests = [
        SpeechRequest("greedy", "A greedy member of the cohort.", voice="vivian", sampling=Sampling.greedy()),
        SpeechRequest("sampled", "A sampled member, seeded.", voice="ryan", sampling=Sampling(seed=1)),
        SpeechRequest("stream", "Streaming text feeds one token per frame.", streaming_text=True, sampling=Sampling(seed=2)),
        SpeechRequest("plain", "No voice and no language.", sampling=Sampling.greedy()),
    ]
    members = [talker.prepare(r, slot) for slot, r in enumerate(requests)]
    slots = [m.slot for m in members]
    for slot in slots:
        vocoder.prepare(slot)

    def frame() -> None:
        talker.step_cohort(members)
        vocoder.step_cohort(slots)

    for _ in range(20):  # warm up: first windows, text track running out, caches of the engines
        frame()
    tracemalloc.start()
    try:
        for _ in range(5):  # traced warm-up: per-member counters now live in traced objects
            frame()
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(STEADY_FRAMES):
            frame()
        end, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(m.frames == 25 + STEADY_FRAMES for m in members)
    print(f"growth {end - start} B, peak {peak - start} B over {STEADY_FRAMES} frames")
    assert end - start <= GROWTH_BOUND, f"traced memory grew by {end - start} bytes over {STEADY_FRAMES} frames"
    assert peak - start <= PEAK_BOUND, f"a step allocated {peak - start} bytes at its peak"
