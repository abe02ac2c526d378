"""Members that do not step come out of the step unchanged, whatever slot they hold.

The batched plans run over rows 0..n-1 (n = the highest stepping slot + 1), so a paused member in a
lower slot sits inside the batch. Its pending code 0 is already marked `seen`; decoding its row
again at a repetition penalty above 1 could re-sample it. Pausing members in the lower, middle and
higher slot, alone and together, must give exactly the frames of a run without pauses, at the
default repetition penalty, greedy and sampled.
"""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest

TEXTS = ["The lower slot speaks first.", "The middle slot has its say.", "And the higher slot ends it."]
STEPS = 40
GREEDY_PENALIZED = Sampling(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.05,
                            cp_temperature=0.0, cp_top_k=0, cp_top_p=1.0)


@pytest.fixture(scope="module")
def core(builtin_artifact, backend):
    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    return core


def run(core: Core, sampling: list[Sampling], paused: set[int]) -> list[np.ndarray]:
    """STEPS steps; the members in `paused` sit out two steps of every three."""
    members = [core.prepare(SpeechRequest(f"r{i}", t, sampling=s, max_frames=400), i)
               for i, (t, s) in enumerate(zip(TEXTS, sampling))]
    for k in range(STEPS):
        core.step([m for m in members if m.slot not in paused or k % 3 == 0])
    return [core.frames(m).copy() for m in members]


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_paused_members_in_every_slot_arrangement_are_unchanged(core, kind):
    artifact = core.artifact
    sampling = ([GREEDY_PENALIZED] * 3 if kind == "greedy"
                else [Sampling.defaults(artifact.sampling).with_overrides({"seed": i}) for i in range(3)])
    assert all(s.repetition_penalty == 1.05 for s in sampling)
    unpaused = run(core, sampling, set())
    for paused in ({0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}):
        got = run(core, sampling, paused)
        for slot, (want, have) in enumerate(zip(unpaused, got)):
            assert have.shape[0] >= STEPS // 3
            assert np.array_equal(have, want[: have.shape[0]]), f"paused {sorted(paused)}: slot {slot} differs"
