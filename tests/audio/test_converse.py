"""`edged converse` (edged/converse/loop.py) on the room rig: the daemon speaking real speech in a
simulated room on JACK, a scripted user (espeak-ng) asking, a local transcription server that records
the audio it is sent, and a local streaming LLM.

A question is transcribed from audio that holds its onset (the pre-roll), answered through the LLM
with the session's history, spoken with the session, and the reply's own echo, heard by the same
microphone, never becomes a turn. A user who cuts the answer off is the next turn, onset kept, and
the LLM then gets the answer only as far as it was heard."""

from __future__ import annotations

import io
import json
import threading
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from support.barge import speaking_room, starts
from support.completions import completions_server, content
from support.patchbay import need_jack_and_espeak, quiet
from support.room import Room, active_rms, at_voice_level
from support.transcription import Answer, transcription_server

from edged.converse.loop import Converse, Settings

need_jack_and_espeak()

QUESTION = "What is the weather like on Mars today?"
ANSWER = ["Mars", " is", " cold", " and", " dry", ",", " with", " thin", " air", "."]
DECIDED_WITHIN_MS = 600 + 32
"""A turn is decided at most one 32 ms `mic` chunk after its end silence (600 ms) has passed after
the VAD's stop (docs/converse.md; measured 608 ms every turn)."""
AUDIO_AFTER_TOKEN_MS = 500
"""The answer's first audio at the speaker at most this long after the LLM's first token
(docs/converse.md; measured median 71 ms, p95 80)."""
LEAD_MS = 50
"""The turn's audio starts at least this long before the user's first sound (the pre-roll: 300 ms
before the VAD's start, which comes 100-260 ms after the onset)."""


LOUD_ECHO = 10.0
"""The echo's gain at the microphone, 20 dB above the other rooms' (test_room.py's loud_room): the VAD
starts on the first reply's residual after boot, so the echo's own starts reach the loop."""
TEXT = "A reply that the microphone hears through the room while it plays."


@pytest.fixture(scope="module")
def room(jack_server, sd, tmp_path_factory):
    """`sd`: pyroomacoustics loads sounddevice in this process; PortAudio is terminated before jackd stops."""
    with speaking_room(jack_server.name, tmp_path_factory.mktemp("converse"), Room(0.5, seed=1), QUESTION,
                       echo_gain=LOUD_ECHO) as setup:
        yield setup


@contextmanager
def conversing(room, lines: list[str], session: str) -> Iterator[tuple]:
    """`edged converse`'s loop on the room's daemon, with a local transcription server answering
    QUESTION and a local LLM answering ANSWER: (the loop, the transcription server, the LLM)."""
    with transcription_server() as asr, completions_server() as llm:
        asr.answer = Answer(body=json.dumps({"text": QUESTION}).encode())
        llm.answers = [content(ANSWER)]
        converse = Converse(Settings(asr.url, "whisper-1", llm.url, "tiny", session=session,
                                     endpoint=room.daemon.endpoint), say=lines.append)
        stop = threading.Event()
        listening = threading.Thread(target=converse.run, args=(stop,))
        listening.start()
        try:
            time.sleep(1.0)  # the subscription reaches the daemon's PUB socket
            yield converse, asr, llm
        finally:
            stop.set()
            listening.join(timeout=60)
            assert not listening.is_alive()


def test_the_replys_own_voice_is_never_a_turn(room):
    """The first reply after boot, 20 dB louder at the microphone: the VAD starts on its residual (the
    daemon's gate refuses it, test_room.py), and the loop must not take it for the user either."""
    lines: list[str] = []
    with conversing(room, lines, "echo") as (converse, asr, _):
        room.sub.clear()
        done = room.client.speak(TEXT, max_audio_ms=4000).wait()
        quiet(room.client, room.rig)
        time.sleep(1.5)  # past the end silence
    playing = [e for e in starts(room.sub) if e["while_playing"]]
    assert playing and not any(e["near_end"] for e in playing), "the VAD never started on the echo: untested"
    assert done.reason == "length", done.report
    assert asr.received == [] and lines == [], lines


def wav_pcm(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (16000, 2, 1)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def until(what, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def test_a_question_is_heard_from_its_onset_and_answered_with_the_session(room):
    voice_rms = active_rms(at_voice_level(room.user))  # the user 5 dB under the daemon's voice at the mic
    lines: list[str] = []
    with conversing(room, lines, "mars") as (converse, asr, llm):
        quiet(room.client, room.rig)
        room.rig.say(room.user, 5, voice_rms)
        until(lambda: converse.answered >= 1, 120, f"no answer: {lines}")
        until(lambda: room.client.status()["playing"] == 0, 60, "the reply never finished playing")
        quiet(room.client, room.rig)
        time.sleep(1.5)  # past the end silence: the reply's echo had its chance to become a turn
    assert len(asr.received) == 1, lines  # the question; the daemon's own voice never
    heard = wav_pcm(asr.received[0].wav)
    first = int(np.flatnonzero(np.abs(heard) > 0.02)[0])
    assert first >= LEAD_MS * 16, f"the onset was cut: first sound {first / 16:.0f} ms into the turn"
    assert len(heard) >= len(room.user) * 16000 // 24000, "the turn is shorter than the question"
    assert llm.messages(0) == [{"role": "user", "content": QUESTION}]
    turns = room.client.history("mars", wait=True)
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[0]["content"] == QUESTION
    assert lines[0] == f"user: {QUESTION}"
    assert lines[1].startswith("assistant: ") and "Mars is cold" in lines[1], lines
    assert lines[2].startswith("timing: end of speech -> turn decided "), lines
    (timing,) = converse.timings
    assert 600 <= timing.decided_ms <= DECIDED_WITHIN_MS, timing
    assert timing.first_token_ms is not None and timing.first_audio_ms is not None, timing
    assert 0 < timing.first_audio_ms - timing.first_token_ms <= AUDIO_AFTER_TOKEN_MS, timing
    assert lines[2] == timing.line()


INTERRUPTION = "Stop, tell me about Venus instead."
LONG = (" Mars is cold and dry, with thin air and red dust, and its days are a little longer than ours."
        .replace(" ", "| ").split("|")[1:] * 6)
"""About 120 pieces, one every 30 ms from the local LLM: still streaming when the user cuts in."""


def test_a_user_who_cuts_the_answer_is_the_next_turn_and_the_llm_gets_only_what_was_heard(room):
    """The user speaks while the answer plays and the LLM still streams it: the listener hears the
    turn (it never waits on the speaker), the answer is cut, and the next prompt holds it as heard."""
    voice_rms = active_rms(at_voice_level(room.user))
    lines: list[str] = []
    with conversing(room, lines, "venus") as (converse, asr, llm):
        llm.answers = [content(LONG), content(["Venus", " is", " hot", "."])]
        quiet(room.client, room.rig)
        room.rig.say(room.user, 5, voice_rms)
        until(lambda: len(asr.received) == 1, 60, f"the question was not heard: {lines}")
        asr.answer = Answer(body=json.dumps({"text": INTERRUPTION}).encode())

        def playing_for(ms: int) -> bool:
            replies = room.client.status()["audio"]["output"].get("replies", [])
            return any(r["played_ms"] >= ms for r in replies)

        until(lambda: playing_for(1500), 60, "the answer never played")
        replies = room.client.status()["audio"]["output"].get("replies", [])
        streaming = any(r["generating"] for r in replies)  # its text still coming in, its frames still made
        room.rig.say(room.user, 5, voice_rms * LOUD_ECHO)  # 5 dB under the answer's echo at the microphone
        until(lambda: converse.answered >= 2, 120, f"the interruption was not answered: {lines}")
        until(lambda: room.client.status()["playing"] == 0, 60, "the second answer never finished playing")
    assert streaming, "the answer had stopped streaming before the user spoke: the case is not what it names"
    assert lines[1].startswith("assistant: ") and lines[1].endswith("  [interrupted]"), lines
    assert len(asr.received) == 2, lines
    cut = wav_pcm(asr.received[1].wav)
    first = int(np.flatnonzero(np.abs(cut) > 0.02)[0])
    assert first >= LEAD_MS * 16, f"the interruption's onset was cut: first sound {first / 16:.0f} ms in"
    asked = llm.messages(1)
    assert [m["role"] for m in asked] == ["user", "assistant", "user"] and asked[2]["content"] == INTERRUPTION
    heard, written = asked[1]["content"], "".join(LONG).strip()
    assert heard == lines[1].removeprefix("assistant: ").removesuffix("  [interrupted]")
    assert len(heard) < len(written) and written.startswith(heard), (heard, written)
