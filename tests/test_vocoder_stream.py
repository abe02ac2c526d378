"""Streamed vocoding equals whole-utterance vocoding: windows of any size carry the decoder's state.

The tolerance, 1e-5, is float noise: the stateful graph recomputes nothing and drops nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

FRAMES = 150  # over twice the decoder's 72-frame attention window
TOLERANCE = 1e-5


def whole_decode(artifact, backend, frames: np.ndarray) -> np.ndarray:
    """All frames in one call of a fresh stream (start 0, zero state)."""
    engine = backend.load(artifact.file("vocoder"))
    n, g = frames.shape
    e = backend.empty
    binds = {"codes": e((1, g, n), np.int64), "start": e((1,), np.int64),
             "pcm": e((1, n * artifact.samples_per_frame), np.float32)}
    for spec in artifact.graphs["vocoder"].state:
        binds[spec.input] = e((1, *spec.shape), np.float32)
        binds[spec.output] = e((1, *spec.shape), np.float32)
    binds["codes"][0] = frames.T
    engine.plan(binds).run()
    return binds["pcm"][0].copy()


@pytest.mark.parametrize("chunk,first", [(1, 1), (4, 1), (3, 2), (7, 5)])
def test_streamed_equals_whole(builtin_artifact, backend, chunk, first):
    artifact = load_artifact(builtin_artifact)
    synth = Synthesizer(artifact, backend, chunk_frames=chunk, first_chunk_frames=first)
    request = SpeechRequest("long", "A long utterance, decoded window by window.", voice="vivian",
                            sampling=Sampling(seed=3), max_frames=FRAMES)
    result = synth.synthesize([request])[0]
    whole = whole_decode(artifact, backend, result.frames)
    assert result.pcm.shape == whole.shape == (FRAMES * 1920,)
    assert np.abs(result.pcm - whole).max() <= TOLERANCE
    assert np.abs(whole).max() > 0.05
