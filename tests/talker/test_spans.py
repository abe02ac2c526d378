"""Length-aware decode attention: a decode plan attends only the first L cache slots (plans bound per
span 64, 128, ..., max_seq), a step runs the shortest span that holds its members' positions, and
that gives the whole cache's result."""

from __future__ import annotations

import numpy as np

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from edged.talker.stage import buckets


def test_spans_double_from_64_to_max_seq():
    assert buckets(512) == [64, 128, 256, 512]
    assert buckets(300) == [64, 128, 256, 300]
    assert buckets(40) == [40]


def test_a_short_span_decodes_as_the_whole_cache(builtin_artifact, backend):
    artifact = load_artifact(builtin_artifact)
    synth = Synthesizer(artifact, backend)
    core, talker = synth.core, synth.core.talker
    member = core.prepare(SpeechRequest("s", "A few words to fill the cache.", voice="vivian",
                                        sampling=Sampling.greedy(), max_frames=40), 0)
    for _ in range(30):
        core.step([member])
    position = member.position
    short, whole = talker.decode_plan(1, position + 1), talker.decode_plans[0][artifact.max_seq]
    assert short.bindings["slots"].shape == (64,) and whole.bindings["slots"].shape == (artifact.max_seq,)
    assert talker.decode_plan(1, 65).bindings["slots"].shape == (128,)
    talker.inputs_embeds[0] = talker.codec_sum[0] + talker.pad_row
    talker.positions[0] = position
    outputs = []
    for plan in (short, whole):
        plan.run()
        outputs.append((talker.hidden[0].copy(), int(talker.code0[0])))
    assert np.allclose(outputs[0][0], outputs[1][0], atol=1e-6) and outputs[0][1] == outputs[1][1]
    core.stop(member)
