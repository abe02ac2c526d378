"""The README's recipes run as written: each `<!-- recipe: NAME -->` block's commands, in order, in
bash from the repository's root, in a home directory of the test's own (HOME, the runtime and state
directories, the Hugging Face cache), with these stand-ins for what this machine has not got:

- a command that installs what `make test` has just installed (`make install-dev`, the doors extra)
  is not run again;
- nothing is waited for but what the recipe itself waits for (`edged status --wait`, curl's
  retries), so a block pasted whole into a shell works as the test runs it;
- a command that runs until Ctrl-C (`edged converse`) gets its Ctrl-C (SIGINT) after a few seconds;
- the Hugging Face Hub is a local endpoint serving a tiny checkpoint under the released repo's name
  (HF_ENDPOINT), and the LLM a local server streaming a chat completion on the recipe's URL;
- the systemd recipe runs in tests/systemd/test_install.py, in a private mount namespace.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = re.compile(r"<!-- recipe: (\w+) -->\n```sh\n(.*?)```", re.S)
INSTALLED_BY_MAKE_TEST = {"make install-dev", ".venv/bin/pip install -e .[doors]"}


def recipes() -> dict[str, list[str]]:
    """name -> its command lines, as written (continued lines joined)."""
    return {name: [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
            for name, block in RECIPE.findall((ROOT / "README.md").read_text())}


def words(line: str) -> list[str]:
    """A command line's words, its comment dropped (for reading it; it runs as written)."""
    return shlex.split(line, comments=True)


UNTIL_CTRL_C_S = 8
"""How long a command that runs until Ctrl-C runs before the test presses it."""


def runs_until_ctrl_c(line: str) -> bool:
    return words(line)[:2] == [".venv/bin/edged", "converse"]


def script(lines: list[str]) -> str:
    out = ["set -euo pipefail"]
    for line in lines:
        if " ".join(words(line)) in INSTALLED_BY_MAKE_TEST:
            continue
        out.append(f"timeout --preserve-status -s INT {UNTIL_CTRL_C_S} {line}" if runs_until_ctrl_c(line) else line)
    return "\n".join(out) + "\n"


def run_recipe(name: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    (home / "run").mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if k not in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY", "NOTIFY_SOCKET", "XDG_STATE_HOME", "XDG_CACHE_HOME")
            and not k.startswith(("HF_", "HUGGING_FACE"))}
    done = subprocess.run(["bash", "-c", script(recipes()[name])], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**base, "HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run"), **env})
    assert done.returncode == 0, f"recipe {name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_every_recipe_is_run_by_a_test():
    assert sorted(recipes()) == ["converse", "doors", "laptop", "llm", "model", "systemd"]


def test_the_laptop_recipe(tmp_path):
    done = run_recipe("laptop", tmp_path)
    assert "wrote out/hello.wav" in done.stdout
    assert "audio.device / --audio-device (speaker)" in done.stdout  # edged devices
    assert '"reason": "' in done.stdout  # edged say's report
    assert re.search(r"^state\s+serving$", done.stdout, re.M)  # edged status


if __name__ == "__main__":
    for name, commands in recipes().items():
        print(f"# {name}\n{script(commands)}")


def test_the_doors_recipe(tmp_path):
    out = ROOT / "out" / "dinner.wav"
    out.unlink(missing_ok=True)
    run_recipe("doors", tmp_path)
    try:
        assert out.read_bytes()[:4] == b"RIFF" and out.stat().st_size > 44
    finally:
        out.unlink()


def test_the_llm_recipe(tmp_path):
    """Two prompts, one session: the second request to the LLM carries the first exchange as the
    daemon's history holds it (the first answer as heard: with no speaker on this machine, by nobody)."""
    from support.completions import completions_server, content

    with completions_server(port=8000) as llm:
        llm.answers = [content(["<think>Mars?</think>", "Mars is **cold**."]), content(["About minus sixty."])]
        done = run_recipe("llm", tmp_path)
    assert [m["role"] for m in llm.messages(1)] == ["user", "assistant", "user"]
    assert [m["content"] for m in llm.messages(1)][::2] == ["What is Mars like?", "And how cold is it?"]
    assert "user: What is Mars like?" in done.stdout and "user: And how cold is it?" in done.stdout  # edged history


def test_the_converse_recipe(tmp_path):
    """The loop starts against the recipe's endpoints (local stand-ins on their ports) and the daemon,
    says that the daemon has no microphone open on this machine, and stops cleanly on Ctrl-C. What it
    does with a microphone is tests/audio/test_converse.py's."""
    from support.completions import completions_server
    from support.transcription import transcription_server

    with transcription_server(port=8080), completions_server(port=8000):
        done = run_recipe("converse", tmp_path)
    assert "edged converse: listening (session 'kitchen'); Ctrl-C stops" in done.stdout
    assert "converse: the daemon's microphone is " in done.stdout and "nothing is heard until it opens" in done.stdout


def test_the_model_recipe(tmp_path, checkpoints):
    """The released repo's name, served by a local hub: a tiny checkpoint (its speakers include
    vivian) under Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice; huggingface_hub's cache is the recipe's home's."""
    from support.hub import checkpoint_files, hub_server

    with hub_server() as hub:
        hub.push("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", checkpoint_files(checkpoints(0)))
        done = run_recipe("model", tmp_path, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_PROGRESS_BARS="1")
    artifact = json.loads((tmp_path / "edged/0.6b-customvoice/artifact.json").read_text())
    assert "vivian" in artifact["speakers"]
    assert (tmp_path / ".cache/huggingface/hub/models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice").is_dir()
    assert re.search(r"^vivian\b", done.stdout, re.M)  # edged voice list
    assert '"reason": "' in done.stdout  # edged say
