"""Batched synthesis equals each request synthesized alone (greedy), including members that join
the running cohort when another member's slot frees up."""

from __future__ import annotations

import numpy as np

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

REQUESTS = [
    SpeechRequest("a", "The first sentence of the batch.", voice="vivian", language="english", max_frames=18),
    SpeechRequest("b", "你好，这是第二句。", voice="eric", language="chinese", max_frames=30),
    SpeechRequest("c", "A third one, streamed as text.", voice="ryan", dual_track=True, max_frames=24),
    SpeechRequest("d", "Fourth: no voice, no language at all.", max_frames=12),
    SpeechRequest("e", "Fifth joins when a slot frees up.", voice="aiden", language="french", max_frames=20),
    SpeechRequest("f", "Sixth, with an instruction.", voice="serena", instruct="Whisper it.", max_frames=15),
]


def _greedy(r: SpeechRequest) -> SpeechRequest:
    return SpeechRequest(r.id, r.text, r.voice, r.language, r.instruct, Sampling.greedy(), r.dual_track, r.max_frames)


def test_batched_equals_alone(builtin_artifact, backend):
    synth = Synthesizer(load_artifact(builtin_artifact), backend)
    assert synth.artifact.max_batch == 4
    requests = [_greedy(r) for r in REQUESTS]
    batched = synth.synthesize(requests)
    for request, together in zip(requests, batched):
        alone = synth.synthesize([request])[0]
        assert together.id == alone.id == request.id
        assert together.frames.shape == (request.max_frames, synth.artifact.dims.code_groups)
        assert np.array_equal(together.frames, alone.frames), request.id
        assert np.abs(together.pcm - alone.pcm).max() <= 1e-5, request.id


def test_sampled_batch_is_reproducible_per_seed(builtin_artifact, backend):
    """A seeded sampled request gives the same frames alone and inside a batch of others."""
    synth = Synthesizer(load_artifact(builtin_artifact), backend)
    seeded = SpeechRequest("s", "Sampled, with a seed.", voice="vivian", max_frames=20,
                           sampling=Sampling(seed=1234))
    others = [_greedy(r) for r in REQUESTS[:3]]
    alone = synth.synthesize([seeded])[0]
    together = synth.synthesize([others[0], seeded, others[1], others[2]])[1]
    assert np.array_equal(alone.frames, together.frames)
    different = synth.synthesize([SpeechRequest("s2", seeded.text, "vivian", max_frames=20, sampling=Sampling(seed=99))])[0]
    assert not np.array_equal(alone.frames, different.frames)
