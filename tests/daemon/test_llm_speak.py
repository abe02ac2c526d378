"""scripts/llm_speak.py against a small local HTTP server that streams chat completions (server-sent
events, as OpenAI-compatible servers send them), into the real daemon: one answer, a conversation
from standard input (in a session, and kept by the script without one), reasoning that is never
spoken, and an LLM that fails. tests/audio/test_llm_conversation.py plays a conversation on a speaker,
where the history keeps what was heard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from support.completions import completions_server, content

from edged.audio.wav import read_wav
from edged.client import Client

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llm_speak.py"
ANSWER = ["Mars", " is", " cold", " and", " dry", ",", " with", " thin", " air", " and", " red", " dust", "."]
REASONED = [{"reasoning_content": "The user asks about Mars."}, {"reasoning_content": " Be brief."},
            *content(["<think>Mars is the fourth planet", ".</think>\n\n**Mars**", " is *cold*", " and", " dry",
                      ",", " with", " `thin`", " air", " and", " red", " dust", "."])]
"""ANSWER with reasoning sent apart, a think block in the content, and markdown."""


def run(url: str, endpoint: str, *extra: str, prompt: str = "What is Mars like?", stdin: str | None = None):
    return subprocess.run([sys.executable, str(SCRIPT), prompt, "--url", url, "--model", "tiny",
                           "--endpoint", endpoint, "--no-play", *extra], input=stdin, capture_output=True, text=True,
                          timeout=300)


def reports(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]


def test_the_bridge_speaks_the_completion_as_it_streams(start_daemon, tmp_path):
    daemon = start_daemon()
    key = tmp_path / "key"
    key.write_text("secret-key\n")
    with completions_server() as llm:
        llm.answers = [content(ANSWER)]
        done = run(llm.url, daemon.endpoint, "--session", "mars", "--system", "Be brief.", "--api-key-file", str(key),
                   "--out", str(tmp_path / "answer.wav"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "".join(ANSWER)
    (report,) = reports(done)
    assert report["reason"] in ("eos", "length") and report["stages"][0]["text_tokens"] > 10
    sent = llm.requests[-1]
    assert sent["auth"] == "Bearer secret-key" and sent["body"]["stream"] is True
    assert sent["body"]["messages"] == [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "What is Mars like?"}]
    with Client(daemon.endpoint) as client:
        turns = client.history("mars", wait=True)
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[1]["response_id"] == report["id"]


def test_a_conversation_from_standard_input_keeps_its_turns_in_the_session(start_daemon):
    """One exchange per line; each sends the LLM the system message and the session's history as the
    daemon holds it (here nothing was heard: the replies were not played), the new prompt last."""
    daemon = start_daemon()
    with completions_server() as llm:
        llm.answers = [content(ANSWER), content(["Yes", ", it", " is", "."])]
        done = run(llm.url, daemon.endpoint, "--session", "talk", "--system", "Be brief.", "--max-audio-ms", "4000",
                   prompt="-", stdin="What is Mars like?\n\nIs it cold?\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["".join(ANSWER), "Yes, it is."]
    first, second = reports(done)
    said = [line for line in done.stderr.splitlines() if line.startswith("llm_speak: --no-play")]
    assert said == ["llm_speak: --no-play: the daemon played nothing and this script acks nothing, so session 'talk' "
                    "keeps this answer as unheard (\"\", interrupted) and the next prompt carries it empty; a client "
                    "that plays the audio itself acks what it played (docs/history.md)"] * 2
    with Client(daemon.endpoint) as client:
        turns = client.history("talk", wait=True)
    assert [(t["role"], t.get("response_id")) for t in turns] == [
        ("user", None), ("assistant", first["id"]), ("user", None), ("assistant", second["id"])]
    assert len(llm.requests) == 2
    assert llm.messages(0) == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is Mars like?"}]
    assert llm.messages(1) == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is Mars like?"},
                               {"role": "assistant", "content": turns[1]["content"]},
                               {"role": "user", "content": "Is it cold?"}]


def test_reasoning_is_neither_spoken_nor_sent_back(start_daemon, tmp_path):
    """Reasoning sent apart never reaches the daemon, and a think block and markdown in the answer are
    not spoken: the audio is the plain answer's. Without a session the script keeps the conversation,
    each answer as spoken."""
    daemon = start_daemon()
    with completions_server() as llm:
        llm.answers = [REASONED]
        reasoned = run(llm.url, daemon.endpoint, "--max-audio-ms", "4000", "--out", str(tmp_path / "reasoned.wav"),
                       prompt="-", stdin="What is Mars like?\nAnd its air?\n")
        llm.answers = [content(ANSWER)]
        plain = run(llm.url, daemon.endpoint, "--max-audio-ms", "4000", "--out", str(tmp_path / "plain.wav"))
    assert reasoned.returncode == 0 and plain.returncode == 0, reasoned.stderr + plain.stderr
    assert "reason" not in reasoned.stdout and "<think>" in reasoned.stdout  # it prints the answer as written
    reasoned_pcm, rate = read_wav(tmp_path / "reasoned.wav")
    plain_pcm, _ = read_wav(tmp_path / "plain.wav")
    assert rate == 24000 and len(plain_pcm) == 4000 * 24
    assert np.array_equal(reasoned_pcm, np.concatenate([plain_pcm, plain_pcm]))
    assert llm.messages(1) == [{"role": "user", "content": "What is Mars like?"},
                               {"role": "assistant", "content": "".join(ANSWER)},
                               {"role": "user", "content": "And its air?"}]


def test_a_failing_llm_is_reported_and_nothing_is_left_open(start_daemon):
    daemon = start_daemon()
    with completions_server() as llm:
        llm.failure = b"model is loading"
        done = run(llm.url, daemon.endpoint)
    gone = run(llm.url, daemon.endpoint)  # the server has shut down: its port refuses
    assert done.returncode == 2 and "HTTP 500: model is loading" in done.stderr
    assert gone.returncode == 2 and f"llm_speak: {llm.url}: [Errno 111] Connection refused" in gone.stderr
    with Client(daemon.endpoint) as client:
        status = client.status()
    assert status["cohort"]["running"] == 0 and status["queue"]["waiting"] == 0
    assert status["counters"]["done"]["cancelled"] == 2
