"""The daemon serves a Qwen3-Omni artifact: a speak with its conversation `context` gives, over the
protocol, the frames and PCM that `Synthesizer` makes offline for the same request (also with the
thinker's hidden states of media placeholders in its binary frame, and with the reply's text streamed
in pieces), and a session's history keeps
what was heard of an Omni reply (and those equal
transformers', tests/test_omni_parity.py); the Qwen3-TTS built-in artifact rejects a context."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support.heard import RATE_CONFIG, expected_prefix

pytest.importorskip("torch")
pytest.importorskip("transformers")

from edged.artifact import load_artifact
from edged.client import Client, RequestRejected
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

FRAMES = 20
CONTEXT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is it December?"}]
MEDIA_CONTEXT = [{"role": "user", "content": "<|audio_start|><|audio_pad|><|audio_pad|><|audio_pad|><|audio_end|>"
                                            "Is it December?"}]


def test_the_daemon_speaks_an_omni_reply_with_its_context(start_daemon, omni_artifacts, backend):
    _, art = omni_artifacts(1, 21)  # the session's, as tests/test_omni_parity.py checks it against transformers
    request = SpeechRequest("r", "Yes, it is the end of the year.", voice="chelsie", max_frames=FRAMES,
                            sampling=Sampling.greedy(), context=tuple((t["role"], t["content"]) for t in CONTEXT))
    artifact = load_artifact(art)
    hidden = np.random.default_rng(2).standard_normal((3, artifact.dims.text_hidden)).astype(np.float16)
    with_media = replace(request, id="m", context=tuple((t["role"], t["content"]) for t in MEDIA_CONTEXT),
                         media=hidden)
    offline, offline_media = Synthesizer(artifact, backend).synthesize([request, with_media])
    daemon = start_daemon(config=f'[daemon]\nartifact = "{art}"\n{RATE_CONFIG}')
    with Client(daemon.endpoint) as client:
        model = client.status()["model"]
        utterance = client.speak(request.text, voice="chelsie", context=CONTEXT, play=False, stream=True,
                                 max_audio_ms=FRAMES * 80, report_codes=True)
        done = utterance.wait()
        media = client.speak(request.text, voice="chelsie", context=MEDIA_CONTEXT, media=hidden, play=False,
                             stream=True, max_audio_ms=FRAMES * 80, report_codes=True)
        media_done = media.wait()
        pieces = ["Yes, it", " is the en", "d of the year."]  # streamed text: the same dual track
        streamed = client.speak_iter(pieces, voice="chelsie", context=CONTEXT, play=False, stream=True,
                                     max_audio_ms=FRAMES * 80, report_codes=True)
        streamed_done = streamed.wait()
        client.turn("omni", "user", "Is it December?")  # the reply's history: what was heard of it
        heard = client.speak(request.text, voice="chelsie", context=CONTEXT, session="omni", play=False, stream=True,
                             max_audio_ms=FRAMES * 80)
        heard.wait()
        client.ack(heard.id, 1000, final=True)
        turns = client.history("omni", wait=True)
        refused = "media: 2 rows of hidden states for 3 media placeholders in the context's user turns"
        with pytest.raises(RequestRejected, match=refused):
            client.speak("Hi.", context=MEDIA_CONTEXT, media=hidden[:2], play=False).wait()
    # the shortest reply prompt: role rows, nothink/think_bos/think_eos/speaker/pad, codec_bos; no instruct
    assert (model["fixed_rows"], model["instruct"], model["instruct_means"], model["languages"]) == (9, False, "none", [])
    assert model["speakers"] == sorted(artifact.speakers) and model["clone"] is False
    assert model["max_reply_ms"] == round(((artifact.max_seq - 9 + 1) * 1920 - 555) / 24, 1)
    assert done.reason == "length" and done.report["rvq_codes"] == offline.frames.tolist()
    assert len(utterance.pcm) == FRAMES * 1920 - 555 and np.array_equal(utterance.pcm, offline.pcm)
    assert "".join(pieces) == request.text and streamed_done.report["rvq_codes"] == offline.frames.tolist()
    assert np.array_equal(streamed.pcm, offline.pcm)
    assert media_done.report["rvq_codes"] == offline_media.frames.tolist()
    assert turns == [{"role": "user", "content": "Is it December?"},
                     {"role": "assistant", "content": expected_prefix(request.text, 1000), "interrupted": True,
                      "response_id": heard.id}]
    assert 0 < len(turns[1]["content"]) < len(request.text)
    assert np.array_equal(media.pcm, offline_media.pcm)


def test_a_tts_artifact_rejects_a_context(shared_daemon):
    refused = "context: this model \\(layout tts\\) takes no conversation context"
    with Client(shared_daemon.endpoint) as client, pytest.raises(RequestRejected, match=refused):
        client.speak("Hello.", context=CONTEXT, play=False).wait()
