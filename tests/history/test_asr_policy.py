"""The `asr` policy end to end in the history thread: the heard audio of an interrupted reply goes to
a real HTTP server speaking the transcription API (transcripts chosen here), and only a conservative
prefix of the ORIGINAL text lands in the history; errors and timeouts keep the default and are not
retried on the same evidence."""

from __future__ import annotations

import io
import time
import wave

import numpy as np
import pytest
from support.history import CLIENT, RATE, Rig
from support.transcription import Answer, transcription_server

from edged.history.asr import Transcriber
from edged.history.policies import AsrPolicy
from edged.history.service import Ended

TEXT = "Hello world again. The rest is unheard."


@pytest.fixture
def server():
    with transcription_server() as endpoint:
        yield endpoint


def speech(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE), dtype=np.float32) / RATE
    return (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)


def interrupted(rig: Rig, id: str, played_ms: int, seconds: float = 4.0) -> None:
    rig.speak(id, text=TEXT, local=True)
    rig.send(Ended(CLIENT, id, "interrupted", int(seconds * 1000), played_ms, speech(seconds), RATE))


def test_the_heard_audio_is_transcribed_and_a_prefix_of_the_original_kept(tmp_path, server):
    server.answer = Answer(body=b'{"text": "hello world again"}')
    rig = Rig(tmp_path, AsrPolicy(Transcriber(server.url, "asr-model", timeout_s=2.0)), timeout_s=3.0)
    try:
        interrupted(rig, "a", 1000)
        turn = rig.assistant(wait=True)
    finally:
        rig.close()
    assert turn == {"role": "assistant", "content": "Hello world", "interrupted": True, "response_id": "a"}
    (got,) = server.received
    assert got.fields == {"model": "asr-model", "response_format": "json"}
    with wave.open(io.BytesIO(got.wav)) as w:  # only what was heard: 1000 ms minus the 160 ms guard
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (RATE, 1, (1000 - 160) * RATE // 1000)


@pytest.mark.parametrize("transcript", [
    b'{"text": "thanks for watching this video"}',  # not what was said: refused
    b'{"text": "hello"}',                           # too little to anchor: refused
])
def test_a_transcript_that_does_not_align_keeps_nothing(tmp_path, server, transcript):
    server.answer = Answer(body=transcript)
    rig = Rig(tmp_path, AsrPolicy(Transcriber(server.url, "m", timeout_s=2.0)), timeout_s=3.0)
    try:
        interrupted(rig, "a", 2000)
        assert rig.assistant(wait=True)["content"] == ""
    finally:
        rig.close()


@pytest.mark.parametrize("answer", [Answer(status=503, body=b'{"error": "busy"}'), Answer(body=b"not json"),
                                    Answer(delay_s=5.0)])
def test_errors_and_timeouts_keep_the_default_and_are_not_retried(tmp_path, server, answer):
    server.answer = answer
    rig = Rig(tmp_path, AsrPolicy(Transcriber(server.url, "m", timeout_s=0.3)), timeout_s=1.0)
    try:
        interrupted(rig, "a", 2000)
        t0 = time.monotonic()
        assert rig.assistant(wait=True)["content"] == ""
        assert time.monotonic() - t0 < 2.0
        assert rig.assistant(wait=True)["content"] == ""  # the same evidence: no second request
    finally:
        rig.close()
    assert len(server.received) == 1


def test_under_half_a_second_heard_sends_nothing(tmp_path, server):
    rig = Rig(tmp_path, AsrPolicy(Transcriber(server.url, "m", timeout_s=1.0)), timeout_s=2.0)
    try:
        interrupted(rig, "a", 600)  # 440 ms after the guard
        assert rig.assistant(wait=True)["content"] == ""
    finally:
        rig.close()
    assert not server.received
