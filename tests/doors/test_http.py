"""`edged http` through OpenAI's own Python client (and raw HTTP where the client hides what is
checked), against the real daemon."""

from __future__ import annotations

import base64
import io
import json
import time
import wave

import openai
import pytest
from support.doors import http

from edged.llm_text import filter_llm_text

TEXT = "Hello from the front door."


def client(front, key: str | None = "") -> openai.OpenAI:
    """OpenAI's client on the door; key "" (default): the right one, None: none sent."""
    key = front.api_key if key == "" else key
    return openai.OpenAI(base_url=f"http://127.0.0.1:{front.http.port}/v1", api_key=key or "none", max_retries=0,
                         timeout=120)


def pcm_of_wav(data: bytes) -> bytes:
    """The samples of a 24 kHz 16-bit mono WAV, read by Python's own reader."""
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getcomptype()) == (24000, 2, 1, "NONE")
        return w.readframes(w.getnframes())


def test_speech_is_a_24khz_wav_of_exactly_the_daemons_audio(front):
    reply = client(front).audio.speech.create(model="tts-1", voice="aiden", input=TEXT, response_format="wav")
    data = reply.read()
    assert reply.response.headers["content-type"] == "audio/wav"
    assert pcm_of_wav(data) == front.reference(TEXT, voice="aiden")
    assert data[:4] == b"RIFF" and data[36:40] == b"data" and len(data) == 44 + len(pcm_of_wav(data))


def test_streamed_pcm_comes_chunk_by_chunk_and_equals_the_daemons(front):
    with client(front).audio.speech.with_streaming_response.create(
            model="edged", voice="default", input=TEXT, response_format="pcm") as reply:
        assert reply.headers["content-type"] == "audio/pcm"
        chunks = list(reply.iter_bytes())
    assert len(chunks) > 1
    assert b"".join(chunks) == front.reference(TEXT)


def test_sse_deltas_carry_the_audio_then_done_with_usage(front):
    reply = client(front).audio.speech.create(model="gpt-4o-mini-tts", voice="serena", input=TEXT,
                                              response_format="pcm", stream_format="sse")
    assert reply.response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in reply.read().decode().splitlines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == front.reference(TEXT, voice="serena")
    usage = events[-1]["usage"]
    assert usage["output_tokens"] > 0 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_instructions_reach_the_model_as_its_instruct(front):
    reply = client(front).audio.speech.create(model="tts-1", voice="vivian", input=TEXT, response_format="pcm",
                                              instructions="Speak slowly and warmly.")
    assert reply.read() == front.reference(TEXT, voice="vivian", instruct="Speak slowly and warmly.")


@pytest.mark.parametrize("fields,param,wanted", [
    ({"voice": "alloy"}, "voice",
     "unknown voice 'alloy' (this model's voices: default, aiden, dylan, eric, ryan, serena, vivian)"),
    ({"response_format": "mp3"}, "response_format", "response_format 'mp3' is not supported (supported: wav, pcm)"),
    ({"speed": 1.5}, "speed", "speed 1.5 is not supported: only 1.0"),
    ({"model": "whisper-1"}, "model", "model 'whisper-1' is not served here (models: edged, tts-1, tts-1-hd, gpt-4o-mini-tts)"),
    ({"input": ""}, "input", "input must be a non-empty string"),
    ({"input": "x" * 4097}, "input", "input is 4097 characters; at most 4096"),
    ({"stream_format": "ws"}, "stream_format", "stream_format 'ws' is not supported (supported: audio, sse)"),
    ({"text_filter": "markdown"}, "text_filter", "text_filter 'markdown' is not supported (supported: llm, none)"),
])
def test_bad_requests_are_400_in_openais_error_shape(front, fields, param, wanted):
    request = {"model": "tts-1", "voice": "aiden", "input": TEXT, **fields}
    extension = {"text_filter": request.pop("text_filter")} if "text_filter" in request else None  # not OpenAI's
    with pytest.raises(openai.BadRequestError) as caught:
        client(front).audio.speech.create(**request, extra_body=extension)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert error["message"] == wanted and error["param"] == param and error["type"] == "invalid_request_error"


LLM_TEXT = "<think>The user wants a greeting.</think>**Hello** from the *front* door."


def test_the_text_filter_drops_reasoning_and_markdown_per_request_or_by_the_doors_default(front, tmp_path):
    """`text_filter: "llm"` in the body (an extension field), or `edged http --text-filter llm` for
    every request without one; absent both, the input is spoken as sent (OpenAI's API)."""
    spoken = filter_llm_text(LLM_TEXT)
    assert spoken == "Hello from the front door."
    asked = client(front).audio.speech.create(model="tts-1", voice="aiden", input=LLM_TEXT, response_format="pcm",
                                              extra_body={"text_filter": "llm"})
    assert asked.read() == front.reference(spoken, voice="aiden")
    plain = client(front).audio.speech.create(model="tts-1", voice="aiden", input=LLM_TEXT, response_format="pcm")
    assert plain.read() == front.reference(LLM_TEXT, voice="aiden")
    door = http(tmp_path, front.daemon.endpoint, "--text-filter", "llm")
    try:
        by_default = openai.OpenAI(base_url=f"http://127.0.0.1:{door.port}/v1", api_key="none", max_retries=0,
                                   timeout=120).audio.speech.create(model="tts-1", voice="aiden", input=LLM_TEXT,
                                                                    response_format="pcm")
        assert by_default.read() == front.reference(spoken, voice="aiden")
    finally:
        assert door.close() == 0, door.read_log()


def test_a_request_the_daemon_rejects_is_a_400_with_its_reason(front):
    with pytest.raises(openai.BadRequestError) as caught:
        client(front).audio.speech.create(model="tts-1", voice="aiden", input="word " * 800)
    assert caught.value.body["message"].startswith("text too long"), caught.value.body


def test_without_the_key_401_and_with_a_wrong_one_401(front):
    for key in (None, "wrong"):
        with pytest.raises(openai.AuthenticationError) as caught:
            client(front, key=key).audio.speech.create(model="tts-1", voice="aiden", input=TEXT)
        assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(front, key=None).models.list()


def test_every_path_but_healthz_needs_the_key_and_unknown_ones_are_404_and_405_in_openais_shape(front):
    import httpx2 as httpx  # openai's own HTTP client

    base = f"http://127.0.0.1:{front.http.port}"
    key = {"Authorization": f"Bearer {front.api_key}"}
    for method, path in (("GET", "/nope"), ("GET", "/v1/audio/speech"), ("POST", "/v1/models")):
        refused = httpx.request(method, base + path)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", (method, path)
    missing = httpx.get(base + "/nope", headers=key)
    assert missing.status_code == 404 and missing.json()["error"] == {
        "message": "GET /nope: Not Found", "type": "invalid_request_error", "param": None, "code": "not_found"}
    wrong = httpx.get(base + "/v1/audio/speech", headers=key)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    lower = httpx.get(base + "/v1/models", headers={"Authorization": f"bearer {front.api_key}"})
    assert lower.status_code == 200  # the scheme is case-insensitive (RFC 9110, 11.1)
    unnamed = httpx.post(base + "/v1/audio/speech", headers=key, json={"input": TEXT, "voice": "aiden"})
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "model"
    assert unnamed.json()["error"]["message"] == "model is missing (models: edged, tts-1, tts-1-hd, gpt-4o-mini-tts)"


def test_models_and_healthz(front):
    assert [m.id for m in client(front).models.list()] == ["edged", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    import httpx2 as httpx  # openai's own HTTP client

    health = httpx.get(f"http://127.0.0.1:{front.http.port}/healthz")  # no key needed
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "daemon": "serving", "model": "custom_voice", "cohort": 0, "queue": 0}


def test_a_busy_daemon_is_429(front):
    with front.busy(), pytest.raises(openai.RateLimitError) as caught:
        client(front).audio.speech.create(model="tts-1", voice="aiden", input=TEXT)
    assert caught.value.status_code == 429 and caught.value.body["message"].startswith("the speech daemon is busy")


def test_a_daemon_that_is_down_is_503(front, tmp_path):
    door = http(tmp_path, f"ipc://{tmp_path / 'nobody.sock'}", "--timeout", "2")
    try:
        gone = openai.OpenAI(base_url=f"http://127.0.0.1:{door.port}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            gone.audio.speech.create(model="tts-1", voice="aiden", input=TEXT)
        assert caught.value.status_code == 503
        assert caught.value.body["message"].startswith("the speech daemon is unavailable"), caught.value.body
    finally:
        assert door.close() == 0, door.read_log()


def test_a_client_that_disconnects_cancels_its_request(front):
    before = front.done_count("cancelled")
    with client(front).audio.speech.with_streaming_response.create(
            model="tts-1", voice="aiden", input=TEXT, response_format="pcm") as reply:
        next(reply.iter_bytes())
    for _ in range(300):
        if front.done_count("cancelled") > before:
            break
        time.sleep(0.1)
    assert front.done_count("cancelled") == before + 1
