"""edged vs the public reference (qwen-tts 0.1.1) on tiny random checkpoints of different shapes.

Greedy codec frames must be equal frame for frame, and the PCM within 1e-4: edged streams it
window by window with carried decoder state, the reference decodes the whole utterance (the first
case runs 90 frames, past the decoder's 72-frame attention window). The reference runs in the
test, from the public package.
"""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.qwen3_tts.reference import reference_synthesize

PARITY_VARIANTS = (0, 1, 2)  # three different shapes (engines/qwen3_tts/tiny.py VARIANTS)
PCM_TOLERANCE = 1e-4
FRAMES = 30
CASES = [
    # (text, speaker, language, instruct, dual_track, frames)
    ("Hello world, this is edged speaking.", None, None, None, False, 90),
    ("The quick brown fox jumps over the lazy dog.", "vivian", "english", None, False, FRAMES),
    ("你好，世界。今天天气很好。", "dylan", "chinese", None, False, FRAMES),  # a dialect voice forces its dialect
    ("Streaming text, one token per frame.", "ryan", "auto", None, True, FRAMES),
    ("Speak this calmly, please.", "serena", "english", "Speak slowly and calmly.", False, FRAMES),
    ("No speaker but a language.", None, "german", None, True, FRAMES),
]


def _edged(synth: Synthesizer, text, speaker, language, instruct, dual_track, max_frames=FRAMES):
    request = SpeechRequest(id="t", text=text, voice=speaker, language=language, instruct=instruct,
                            sampling=Sampling.greedy(), dual_track=dual_track, max_frames=max_frames)
    return synth.synthesize([request])[0]


@pytest.mark.parametrize("variant", PARITY_VARIANTS)
def test_greedy_frames_and_pcm_equal_reference(variant, artifacts, tiny_reference, backend):
    synth = Synthesizer(load_artifact(artifacts(variant)), backend)
    reference = tiny_reference(variant)
    for text, speaker, language, instruct, dual_track, frames in CASES:
        ref_codes, ref_pcm = reference_synthesize(
            reference, text, speaker=speaker, language=language or "auto", instruct=instruct,
            max_frames=frames, greedy=True, non_streaming_mode=not dual_track)
        got = _edged(synth, text, speaker, language, instruct, dual_track, max_frames=frames)
        case = f"variant {variant}: {text!r} speaker={speaker} language={language} dual_track={dual_track}"
        assert got.frames.shape == ref_codes.shape, case
        assert np.array_equal(got.frames, ref_codes), case
        assert got.reason == "length"
        assert got.pcm.shape == ref_pcm.shape, case
        assert np.abs(got.pcm - ref_pcm).max() <= PCM_TOLERANCE, case


def test_eos_stops_like_the_reference(eos_artifact, backend):
    """The eos frame is not emitted, eos is masked for the first two decisions, reason is eos (on the
    checkpoint whose eos row follows a code's: conftest's `eos_artifact`)."""
    from engines.qwen3_tts.reference import load_reference

    checkpoint, artifact = eos_artifact
    synth = Synthesizer(load_artifact(artifact), backend)
    reference = load_reference(checkpoint)
    stops = []
    for text in ("Hello world, this is edged speaking.", "Another sentence, quite different.", "短句"):
        ref_codes, ref_pcm = reference_synthesize(reference, text, speaker="vivian", language="english", max_frames=60)
        got = _edged(synth, text, "vivian", "english", None, False, max_frames=60)
        assert np.array_equal(got.frames, ref_codes), text
        assert got.reason == "eos" and got.frames.shape[0] < 60
        assert np.abs(got.pcm - ref_pcm).max() <= PCM_TOLERANCE
        stops.append(got.frames.shape[0])
    assert len(set(stops)) > 1, "eos should fall at text-dependent frames"
