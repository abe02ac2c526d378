"""The daemon serves a Qwen3-Omni artifact: a speak with its conversation `context` gives, over the
protocol, the frames and PCM that `Synthesizer` makes offline for the same request (and those equal
transformers', tests/test_omni_parity.py); the Qwen3-TTS built-in artifact rejects a context."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from edged.artifact import load_artifact
from edged.client import Client, RequestRejected
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.qwen3_omni.artifact import export
from engines.qwen3_omni.tiny import build_tiny

FRAMES = 20
CONTEXT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is it December?"}]


def test_the_daemon_speaks_an_omni_reply_with_its_context(start_daemon, tmp_path, backend):
    art = tmp_path / "art"
    export(build_tiny(tmp_path / "ckpt", seed=5, variant=1), art, max_batch=4, max_seq=128)
    request = SpeechRequest("r", "Yes, it is the end of the year.", voice="chelsie", max_frames=FRAMES,
                            sampling=Sampling.greedy(), context=tuple((t["role"], t["content"]) for t in CONTEXT))
    offline = Synthesizer(load_artifact(art), backend).synthesize([request])[0]
    daemon = start_daemon(config=f'[daemon]\nartifact = "{art}"\n')
    with Client(daemon.endpoint) as client:
        utterance = client.speak(request.text, voice="chelsie", context=CONTEXT, play=False, stream=True,
                                 max_audio_ms=FRAMES * 80, report_codes=True)
        done = utterance.wait()
    assert done.reason == "length" and done.report["rvq_codes"] == offline.frames.tolist()
    assert len(utterance.pcm) == FRAMES * 1920 - 555 and np.array_equal(utterance.pcm, offline.pcm)


def test_a_tts_artifact_rejects_a_context(shared_daemon):
    refused = "context: this model \\(layout tts\\) takes no conversation context"
    with Client(shared_daemon.endpoint) as client, pytest.raises(RequestRejected, match=refused):
        client.speak("Hello.", context=CONTEXT, play=False).wait()
