"""The voice loop's speaker half (edged/converse/loop.py) with the real daemon, a local transcription
server and a local streaming LLM, its turns handed in as the listener hands them (the microphone's
side is tests/audio/test_converse.py's): a failing transcription is one line and the next turn is
answered, a turn that comes while the LLM still streams is answered next with the history as heard,
and a wake phrase gates the answers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from support.completions import completions_server, content
from support.daemon import Daemon
from support.transcription import Answer, transcription_server

from edged.converse.loop import Converse, Heard, Settings, after_wake
from edged.converse.turns import Turn


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("converse-loop"))
    yield d
    d.close()


def turn() -> Heard:
    pcm = np.zeros(16000, np.int16)
    return Heard(Turn(0, 4800, 12800, 22400, pcm), time.time())


def said(text: str) -> Answer:
    return Answer(body=json.dumps({"text": text}).encode())


@contextmanager
def speaker(daemon, session: str, **settings) -> Iterator[tuple]:
    """The loop's speaker thread on `daemon`, fed by hand: (the loop, its lines, the transcriber, the LLM)."""
    lines: list[str] = []
    with transcription_server() as asr, completions_server() as llm:
        converse = Converse(Settings(asr.url, "whisper-1", llm.url, "tiny", session=session, endpoint=daemon.endpoint,
                                     **settings), say=lines.append)
        thread = threading.Thread(target=converse._speaker)
        thread.start()
        try:
            yield converse, lines, asr, llm
        finally:
            converse.heard.put(None)
            thread.join(timeout=120)
            assert not thread.is_alive()


def answered(converse: Converse, n: int) -> None:
    deadline = time.monotonic() + 120
    while converse.answered < n:
        assert time.monotonic() < deadline, f"{converse.answered} turns done, waited for {n}"
        time.sleep(0.05)


def test_a_failing_transcription_is_one_line_and_the_next_turn_is_answered(daemon):
    with speaker(daemon, "asr-down") as (converse, lines, asr, llm):
        asr.answer = Answer(status=503, body=b'{"error": "loading"}')
        converse.heard.put(turn())
        answered(converse, 1)
        asr.answer = said("Is it cold on Mars?")
        llm.answers = [content(["Very", " cold", "."])]
        converse.heard.put(turn())
        answered(converse, 2)
    assert lines[0].startswith(f"converse: transcription failed ({asr.url}): ") and lines[0].endswith("; listening on")
    assert lines[1] == "user: Is it cold on Mars?" and lines[2].startswith("assistant: "), lines
    assert len(llm.requests) == 1 and llm.messages(0) == [{"role": "user", "content": "Is it cold on Mars?"}]


def test_a_turn_while_the_llm_streams_is_answered_next_with_the_history_as_heard(daemon):
    """The second question comes while the first answer still streams: it waits its turn, and the LLM
    gets the first answer as the daemon's history holds it: heard by nobody here (no speaker), so
    empty, never the text the LLM wrote."""
    first = ["Mars", " is", " far", " away", ","] * 12  # a piece every 30 ms: about 2 s of streaming
    with speaker(daemon, "busy") as (converse, lines, asr, llm):
        asr.answer = said("Where is Mars?")
        llm.answers = [content(first), content(["Yes", "."])]
        converse.heard.put(turn())
        while not llm.requests:
            time.sleep(0.01)
        asr.answer = said("Is it cold?")
        converse.heard.put(turn())
        answered(converse, 2)
    assert [line for line in lines if line.startswith("user: ")] == ["user: Where is Mars?", "user: Is it cold?"]
    assert llm.messages(1) == [{"role": "user", "content": "Where is Mars?"}, {"role": "assistant", "content": ""},
                               {"role": "user", "content": "Is it cold?"}]


def test_a_wake_phrase_gates_the_answers_and_keeps_the_loop_awake(daemon):
    with speaker(daemon, "wake", wake="hey kitchen", awake_s=60.0) as (converse, lines, asr, llm):
        llm.answers = [content(["Noon", "."])]
        for text in ("What time is it?", "Hey, Kitchen! What time is it?", "And tomorrow?"):
            asr.answer = said(text)
            converse.heard.put(turn())
            answered(converse, converse.answered + 1)
    assert lines[0] == "user: What time is it?  [not addressed: no wake phrase]"
    assert [m["content"] for m in llm.messages(0) if m["role"] == "user"] == ["What time is it?"]
    assert [m["content"] for m in llm.messages(1) if m["role"] == "user"] == ["What time is it?", "And tomorrow?"]
    assert len(llm.requests) == 2


@pytest.mark.parametrize("text, rest", [
    ("hey kitchen what now", "what now"), ("Hey, Kitchen! What now?", "What now?"), ("hey kitchen", ""),
    ("hey kit chen", None), ("they kitchen", None), ("HEY   kitchen, lights", "lights"),
])
def test_the_wake_phrase_is_matched_on_words(text, rest):
    assert after_wake(text, "Hey kitchen") == rest
