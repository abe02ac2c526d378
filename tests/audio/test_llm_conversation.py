"""A spoken conversation: scripts/llm_speak.py, a local chat completions server, and the real daemon
playing on JACK's dummy backend. The first answer (a think block and markdown) is cut by
--max-audio-ms; the history keeps the words heard (the rate policy), and that is what the LLM gets
back as the first answer in the second exchange."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.completions import completions_server, content
from support.daemon import Daemon
from support.heard import RATE_CONFIG, expected_prefix

from edged.client import Client

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llm_speak.py"
FIRST = content(["<think>A short", " answer.</think>\n\n**Mars**", " is *cold*", " and", " dry", ",", " with", " thin",
                 " air", " and", " red", " dust", ",", " and", " its", " days", " are", " a", " little", " longer",
                 " than", " ours", "."])
SPOKEN = "Mars is cold and dry, with thin air and red dust, and its days are a little longer than ours."


def test_the_next_prompt_carries_the_answer_as_far_as_it_was_heard(jack_server, tmp_path):
    daemon = Daemon(tmp_path, config=f'[audio]\ndevice = "system"\ninput_device = "none"\n{RATE_CONFIG}')
    try:
        with Client(daemon.endpoint) as client:
            assert client.status()["audio"]["output"]["state"] == "open"
        with completions_server() as llm:
            llm.answers = [FIRST, content(["It", " is", " very", " cold", "."])]
            done = subprocess.run([sys.executable, str(SCRIPT), "-", "--url", llm.url, "--model", "tiny", "--endpoint",
                                   daemon.endpoint, "--session", "mars", "--max-audio-ms", "2000"],
                                  input="What is Mars like?\nIs it cold?\n", capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        first, second = (json.loads(line) for line in done.stderr.splitlines() if line.startswith("{"))
        with Client(daemon.endpoint) as client:
            turns = client.history("mars", wait=True)
    finally:
        daemon.close()
    assert first["reason"] == "length" and first["played_ms"] >= 1500
    heard = expected_prefix(SPOKEN, first["played_ms"])
    assert heard and len(heard) < len(SPOKEN)  # cut: only the words heard, no reasoning, no markup
    assert llm.messages(1) == [{"role": "user", "content": "What is Mars like?"},
                               {"role": "assistant", "content": heard},
                               {"role": "user", "content": "Is it cold?"}]
    assert turns[:3] == [{"role": "user", "content": "What is Mars like?"},
                         {"role": "assistant", "content": heard, "interrupted": True, "response_id": first["id"]},
                         {"role": "user", "content": "Is it cold?"}]
    assert turns[3]["response_id"] == second["id"]
