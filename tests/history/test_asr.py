"""The transcription client against a real HTTP server (127.0.0.1, in a thread) that speaks the
OpenAI transcription API: it parses the multipart form, records what it got and answers what the
test chose. Heard audio per the heard-text notes §3.1: 1000 ms played at 24 kHz, 160 ms guard ->
20160 frames of 16-bit mono."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import wave
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from support.transcription import Answer, Endpoint, transcription_server

from edged.audio.wav import wav_bytes
from edged.history.asr import Transcriber, TranscriptionError, heard_pcm

RATE = 24000
MODEL = "Qwen/Qwen3-ASR-0.6B"


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    with transcription_server() as ep:
        yield ep


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE), dtype=np.float32) / RATE
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def frames_of(wav: bytes) -> tuple[wave._wave_params, np.ndarray]:
    with wave.open(io.BytesIO(wav), "rb") as w:
        params = w.getparams()
        return params, np.frombuffer(w.readframes(params.nframes), "<i2")


def expect_error(call: Callable[[], object], *needles: str) -> str:
    with pytest.raises(TranscriptionError) as info:
        call()
    for needle in needles:
        assert needle in info.value.reason
    return info.value.reason


# ------------------------------------------------------------------------------------ heard audio


def test_heard_pcm_is_played_ms_minus_the_guard():
    pcm = tone(3.0)
    heard = heard_pcm(pcm, RATE, 1000)
    assert heard is not None and len(heard) == (1000 - 160) * 24 == 20160
    assert np.array_equal(heard, pcm[:20160])
    assert len(heard_pcm(pcm, RATE, 1000, guard_ms=0.0)) == RATE
    assert len(heard_pcm(pcm, RATE, 10_000)) == len(pcm)  # never past the audio


def test_heard_pcm_refuses_under_half_a_second_or_non_finite():
    pcm = tone(3.0)
    assert heard_pcm(pcm, RATE, 659) is None  # 499 ms after the guard
    assert len(heard_pcm(pcm, RATE, 660)) == RATE // 2  # exactly 0.5 s
    assert heard_pcm(pcm, RATE, 100) is None  # the guard exceeds what was played
    assert heard_pcm(tone(0.4), RATE, 5000) is None  # the reply itself was short
    bad = pcm.copy()
    bad[100] = np.nan
    assert heard_pcm(bad, RATE, 1000) is None
    with pytest.raises(ValueError):
        heard_pcm(np.zeros((2, RATE), np.float32), RATE, 1000)


def test_wav_bytes_is_clipped_16_bit_mono():
    pcm = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0], np.float32)
    params, frames = frames_of(wav_bytes(pcm, 16000))
    assert (params.nchannels, params.sampwidth, params.framerate, params.nframes) == (1, 2, 16000, 7)
    assert frames.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]
    with pytest.raises(ValueError):
        wav_bytes(np.array([np.inf], np.float32), 16000)


# ------------------------------------------------------------------------------------ transcribe


def test_good_transcript_and_what_the_server_received(endpoint):
    pcm = tone(3.0)
    heard = heard_pcm(pcm, RATE, 1000)
    assert heard is not None
    text = Transcriber(endpoint.url, MODEL, timeout_s=2.0).transcribe(wav_bytes(heard, RATE))
    assert text == "Hello world again"
    (got,) = endpoint.received
    assert got.path == "/v1/audio/transcriptions"
    assert got.fields == {"model": MODEL, "response_format": "json"}
    assert (got.filename, got.file_type) == ("heard.wav", "audio/wav")
    params, frames = frames_of(got.wav)
    assert (params.nchannels, params.sampwidth, params.framerate, params.nframes) == (1, 2, RATE, 20160)
    assert np.array_equal(frames, np.rint(pcm[:20160] * 32767).astype(np.int16))


def test_transcripts_run_concurrently_from_threads(endpoint):
    transcriber = Transcriber(endpoint.url, MODEL, timeout_s=2.0)
    wav = wav_bytes(tone(0.6), RATE)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(transcriber.transcribe(wav))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == ["Hello world again"] * 4 and len(endpoint.received) == 4


def test_http_503_is_an_error_naming_the_status(endpoint):
    endpoint.answer = Answer(status=503, body=b'{"error": "overloaded"}')
    expect_error(lambda: Transcriber(endpoint.url, MODEL).transcribe(wav_bytes(tone(0.6), RATE)), "503")


@pytest.mark.parametrize("body, needle", [
    (b"<html>not json</html>", "not JSON"),
    (b'{"transcript": "hello"}', "text"),
    (b'{"text": 42}', "text"),
    (b'["hello"]', "text"),
])
def test_a_malformed_answer_is_an_error(endpoint, body, needle):
    endpoint.answer = Answer(body=body)
    expect_error(lambda: Transcriber(endpoint.url, MODEL).transcribe(wav_bytes(tone(0.6), RATE)), needle)


def test_a_too_long_transcript_is_an_error(endpoint):
    endpoint.answer = Answer(body=json.dumps({"text": "a" * 101}).encode())
    transcriber = Transcriber(endpoint.url, MODEL, max_chars=100)
    expect_error(lambda: transcriber.transcribe(wav_bytes(tone(0.6), RATE)), "101", "100")
    endpoint.answer = Answer(body=json.dumps({"text": "a" * 100}).encode())
    assert transcriber.transcribe(wav_bytes(tone(0.6), RATE)) == "a" * 100


@pytest.mark.parametrize("answer", [Answer(delay_s=10.0), Answer(trickle=True)], ids=["silent", "trickling"])
def test_a_server_slower_than_the_timeout_is_an_error_within_it(endpoint, answer):
    endpoint.answer = answer
    transcriber = Transcriber(endpoint.url, MODEL, timeout_s=0.3)
    t0 = time.monotonic()
    expect_error(lambda: transcriber.transcribe(wav_bytes(tone(0.6), RATE)), "timed out")
    assert time.monotonic() - t0 < 0.3 + 1.0
    assert len(endpoint.received) == 1  # it did reach the server


def test_connection_refused_is_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the call: nothing listens there
    t0 = time.monotonic()
    expect_error(lambda: Transcriber(f"http://127.0.0.1:{port}/v1/audio/transcriptions", MODEL, timeout_s=1.0)
                 .transcribe(wav_bytes(tone(0.6), RATE)), "request failed")
    assert time.monotonic() - t0 < 1.0


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("url, needle", [
    ("ftp://127.0.0.1/v1/audio/transcriptions", "http or https"),
    ("127.0.0.1:8000/v1/audio/transcriptions", "http or https"),
    ("", "http or https"),
    ("http://user:pass@127.0.0.1:8000/v1/audio/transcriptions", "credentials"),
    ("https://token@asr.example/v1/audio/transcriptions", "credentials"),
    ("http:///v1/audio/transcriptions", "no host"),
    ("http://:8000/v1/audio/transcriptions", "no host"),
    ("http://127.0.0.1:99999/v1/audio/transcriptions", "port"),
])
def test_url_validation(url, needle):
    with pytest.raises(ValueError, match=needle):
        Transcriber(url, MODEL)


def test_settings_validation():
    url = "https://asr.example/v1/audio/transcriptions"
    Transcriber(url, MODEL)
    with pytest.raises(ValueError, match="timeout_s"):
        Transcriber(url, MODEL, timeout_s=0)
    with pytest.raises(ValueError, match="max_chars"):
        Transcriber(url, MODEL, max_chars=0)
