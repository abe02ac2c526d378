"""Qwen3-TTS VoiceDesign: a checkpoint without speakers whose voice a request's `instruct` describes.
`edged-engines tiny --kind voice_design` builds one; its artifact's greedy frames equal qwen-tts's
own `generate_voice_design` (the PCM within 1e-4), and the daemon serves it: a speak with an
instruct and no voice gets the frames `Synthesizer` makes offline, a speak naming a voice is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.daemon import Daemon

pytest.importorskip("torch")

from edged.artifact import load_artifact
from edged.client import Client, RequestRejected
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.qwen3_tts.reference import reference_design

PCM_TOLERANCE = 1e-4
KIND = "voice_design"
CASES = [  # text, instruct, language, dual track
    ("Hello world, this is edged speaking.", "A warm, low male voice, speaking slowly.", None, False),
    ("The quick brown fox jumps over the lazy dog.", "A bright young woman, cheerful and fast.", "english", False),
    ("你好，世界。今天天气很好。", "一个温柔的女声，语速平缓。", "chinese", False),
    ("Streaming text, one token per frame.", "An old man with a gravelly voice.", None, True),
    ("No description at all.", "", "english", False),
]


@pytest.mark.parametrize("variant", [0, 1])
def test_greedy_frames_equal_generate_voice_design(variant, artifacts, tiny_reference, backend):
    artifact = load_artifact(artifacts(variant, 0, KIND))
    assert (artifact.model_type, artifact.supports_instruct, artifact.speakers) == (KIND, True, {})
    synth = Synthesizer(artifact, backend)
    reference = tiny_reference(variant, 0, KIND)
    frames = []
    for text, instruct, language, dual in CASES:
        codes, pcm = reference_design(reference, text, instruct, language=language or "auto", max_frames=24,
                                      non_streaming_mode=not dual)
        request = SpeechRequest("d", text, language=language, instruct=instruct or None, dual_track=dual,
                                sampling=Sampling.greedy(), max_frames=24)
        got = synth.synthesize([request])[0]
        case = f"variant {variant}: {text!r} instruct={instruct!r}"
        assert got.frames.shape == codes.shape and np.array_equal(got.frames, codes), case
        assert got.pcm.shape == pcm.shape and np.abs(got.pcm - pcm).max() <= PCM_TOLERANCE, case
        frames.append(got.frames)
    assert not np.array_equal(frames[0], frames[1]), "the described voices should differ"


def test_the_daemon_speaks_the_voice_an_instruct_describes(artifacts, backend, tmp_path):
    art = artifacts(0, 0, KIND)
    text, instruct = "Hello world, this is edged speaking.", "A warm, low male voice, speaking slowly."
    offline = Synthesizer(load_artifact(art), backend).synthesize(
        [SpeechRequest("o", text, instruct=instruct, sampling=Sampling.greedy(), max_frames=16)])[0]
    daemon = Daemon(tmp_path, config=f'[daemon]\nartifact = "{art}"\n')
    try:
        with Client(daemon.endpoint) as client:
            status = client.status()
            speech = client.speak(text, instruct=instruct, play=False, stream=True, max_audio_ms=16 * 80,
                                  report_codes=True)
            done = speech.wait()
            with pytest.raises(RequestRejected, match="unknown voice 'vivian': this model has no built-in speakers; "
                                                      "describe the voice in instruct"):
                client.speak(text, voice="vivian", instruct=instruct, play=False).wait()
    finally:
        daemon.close()
    assert status["model"]["type"] == KIND and status["model"]["speakers"] == [], json.dumps(status["model"])
    assert (status["model"]["instruct"], status["model"]["instruct_means"]) == (True, "voice")
    assert done.reason == "length" and done.report["rvq_codes"] == offline.frames.tolist()
    assert speech.pcm.shape == offline.pcm.shape and np.abs(speech.pcm - offline.pcm).max() <= 1e-5  # threads differ


def test_edged_engines_tiny_builds_a_voice_design_checkpoint(tmp_path):
    from engines.cli import main
    from engines.qwen3_tts.config import Qwen3TTSConfig

    assert main(["tiny", "--kind", KIND, "--variant", "2", "--out", str(tmp_path / "vd")]) == 0
    config = Qwen3TTSConfig.from_checkpoint(tmp_path / "vd")
    assert (config.model_type, config.instruct, config.speakers) == (KIND, True, {})
