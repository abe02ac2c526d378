"""Sampling settings end to end: validation, degenerate settings equal greedy, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.request import Sampling, SamplingError, SpeechRequest
from edged.synth import Synthesizer

TEXT = "Sampling settings, checked end to end."


@pytest.fixture(scope="module")
def synth(builtin_artifact, backend):
    return Synthesizer(load_artifact(builtin_artifact), backend)


def _run(synth, sampling, frames=16):
    return synth.synthesize([SpeechRequest("x", TEXT, voice="vivian", sampling=sampling, max_frames=frames)])[0].frames


def test_top_k_1_and_tiny_top_p_equal_greedy(synth):
    greedy = _run(synth, Sampling.greedy())
    top1 = Sampling(temperature=1.0, top_k=1, repetition_penalty=1.0, cp_temperature=1.0, cp_top_k=1, seed=3)
    assert np.array_equal(_run(synth, top1), greedy)
    nucleus = Sampling(temperature=0.8, top_k=0, top_p=1e-6, repetition_penalty=1.0,
                       cp_temperature=0.8, cp_top_k=0, cp_top_p=1e-6, seed=4)
    assert np.array_equal(_run(synth, nucleus), greedy)


def test_same_seed_same_frames_other_seed_differs(synth):
    a = _run(synth, Sampling(seed=7))
    assert np.array_equal(a, _run(synth, Sampling(seed=7)))
    assert not np.array_equal(a, _run(synth, Sampling(seed=8)))


def test_sampled_codes_are_codes(synth):
    frames = _run(synth, Sampling(temperature=1.5, top_k=0, seed=1), frames=30)
    assert frames.min() >= 0 and frames.max() < 2048  # specials are suppressed for code 0


@pytest.mark.parametrize("overrides,message", [
    ({"temperature": -1}, "sampling.temperature must be in"),
    ({"top_p": 0}, r"sampling.top_p must be in \(0, 1\]"),
    ({"top_k": 2.5}, "sampling.top_k must be a non-negative integer"),
    ({"repetition_penalty": 0}, "sampling.repetition_penalty must be in"),
    ({"cp_top_p": 1.5}, "sampling.cp_top_p must be in"),
    ({"seed": -3}, "sampling.seed must be a non-negative integer"),
    ({"temperature": "hot"}, "sampling.temperature must be a number"),
    ({"beam": 4}, "unknown sampling key"),
    ({"cp_spec_verify_size": 1}, r"sampling.cp_spec_verify_size must be 0 \(off\) or an integer in 2..8, got 1"),
    ({"cp_spec_verify_size": 9}, r"sampling.cp_spec_verify_size must be 0 \(off\) or an integer in 2..8, got 9"),
    ({"cp_spec_verify_size": 2.5}, r"sampling.cp_spec_verify_size must be 0 \(off\) or an integer in 2..8"),
    ({"cp_spec_verify_size": "4"}, "sampling.cp_spec_verify_size must be a number"),
])
def test_bad_sampling_is_named(overrides, message):
    with pytest.raises(SamplingError, match=message):
        Sampling().with_overrides(overrides)
