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
from edged.request import SpeechRequest
from edged.talker.port import CodecPort
from edged.talker.sampling import Sampling
from edged.talker.stage import TalkerStage

TEXTS = ["The lower slot speaks first.", "The middle slot has its say.", "And the higher slot ends it."]
STEPS = 40
GREEDY_PENALIZED = Sampling(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.05,
                            cp_temperature=0.0, cp_top_k=0, cp_top_p=1.0)


@pytest.fixture(scope="module")
def stage(builtin_artifact, backend):
    artifact = load_artifact(builtin_artifact)
    port = CodecPort(artifact.max_batch, artifact.max_seq, artifact.dims.code_groups)
    talker = TalkerStage(artifact, backend, artifact.tables(), port)
    talker.preallocate()
    return talker, port


def run(stage, sampling: list[Sampling], paused: set[int]) -> list[np.ndarray]:
    """STEPS steps; the members in `paused` sit out two steps of every three."""
    talker, port = stage
    members = [talker.prepare(SpeechRequest(f"r{i}", t, sampling=s, max_frames=400), i)
               for i, (t, s) in enumerate(zip(TEXTS, sampling))]
    for k in range(STEPS):
        stepping = [m for m in members if m.slot not in paused or k % 3 == 0]
        talker.step_cohort(stepping)
    frames = min(m.frames for m in members)
    return [port.frames(m.slot)[:frames].copy() for m in members]


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_paused_members_in_every_slot_arrangement_are_unchanged(stage, kind):
    artifact = stage[0].artifact
    sampling = ([GREEDY_PENALIZED] * 3 if kind == "greedy"
                else [Sampling.defaults(artifact.sampling).with_overrides({"seed": i}) for i in range(3)])
    assert all(s.repetition_penalty == 1.05 for s in sampling)
    unpaused = run(stage, sampling, set())
    for paused in ({0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}):
        got = run(stage, sampling, paused)
        for slot, (want, have) in enumerate(zip(unpaused, got)):
            assert have.shape[0] >= STEPS // 3
            assert np.array_equal(have, want[: have.shape[0]]), f"paused {sorted(paused)}: slot {slot} differs"
