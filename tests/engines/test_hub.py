"""A checkpoint by its Hugging Face repo id (`edged-engines pull`, `export --checkpoint OWNER/NAME`),
against a hub on 127.0.0.1 that serves repositories as the Hugging Face Hub's HTTP API does
(tests/support/hub.py). The CLI runs as a subprocess with its own environment: HF_ENDPOINT at the
test hub, HF_HOME in the test's directory (huggingface_hub reads both when it is imported, and this
process runs offline: tests/conftest.py).

1. An export from a repo id is the export of the checkpoint directory it serves; only the files the
   export opens are fetched.
2. A pinned revision (a commit, a tag) gets its files after the branch has moved on; an offline run
   finds it by the tag; an unknown revision is one line.
3. The token (HF_TOKEN, the file `huggingface-cli login` writes, HF_TOKEN_PATH) reaches the hub;
   a gated repo without one, and an unknown repo, are one line saying how to log in; a token not
   granted the repo, and one the hub does not know, are one line too.
4. A download cut off mid-file is resumed by the next run with a Range request.
5. With the cache filled, an export runs with HF_HUB_OFFLINE=1 and with the hub down; not cached
   and no hub, it is one line.
6. Of a sharded Qwen3-Omni checkpoint only the shards holding what its export reads are fetched;
   one with the slow tokenizer's files and no tokenizer.json exports the tokenizer they make.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # the tiny checkpoints

from support.hub import Hub, checkpoint_files, hub_server

ROOT = Path(__file__).resolve().parents[2]
TTS, OMNI = "edged/tiny-tts", "edged/tiny-omni"
EXTRA = {"README.md": b"# a tiny checkpoint\n", "original/model.pt": b"\0" * 4096}
"""Files a repository holds that no export opens."""
TOKEN = "hf_testtoken"


def engines(home: Path, endpoint: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`edged-engines ARGS` with the hub's settings from this test alone (HF_HOME, HF_ENDPOINT, `env`)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    clean.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_PROGRESS_BARS="1",
                 PYTHONPATH=os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, "-m", "engines.cli", *args], env=clean, cwd=home.parent,
                          capture_output=True, text=True, timeout=600)


def one_line(done: subprocess.CompletedProcess, command: str) -> str:
    """The failure's message: exit 2, one line on stderr, no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"edged-engines {command}: "), done.stderr
    return done.stderr.strip()


def pulled(done: subprocess.CompletedProcess) -> Path:
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def hub():
    with hub_server() as served:
        yield served


def test_a_repo_id_brings_exactly_the_files_the_export_opens(hub: Hub, checkpoints, tmp_path):
    """`pull` fetches each file the export opens, byte for byte, and nothing else (no README, no .pt).
    An export by repo id exports that snapshot's directory; it runs, as written, in the README's model
    recipe (tests/test_recipes.py), against a hub like this one."""
    files = checkpoint_files(checkpoints(0))
    commit = hub.push(TTS, {**files, **EXTRA})
    snapshot = pulled(engines(tmp_path / "home", hub.url, "pull", TTS))
    assert checkpoint_files(snapshot) == files
    assert sorted(set(hub.files_fetched())) == sorted(files)
    assert not set(EXTRA) & set(hub.files_fetched("HEAD"))
    # main resolved once, then everything by that commit: a branch that moves meanwhile cannot mix two commits
    assert hub.revisions_asked()[0] == "main" and set(hub.revisions_asked()[1:]) <= {commit}
    assert hub.revisions_fetched() == {commit}


def test_a_pinned_revision_gets_its_files_after_the_branch_moved_on(hub: Hub, checkpoints, tmp_path):
    files = checkpoint_files(checkpoints(0))
    first = hub.push(TTS, files, tags=("v1",))
    moved = {**files, "generation_config.json": b'{"temperature": 0.5}\n'}
    second = hub.push(TTS, moved)
    home = tmp_path / "home"
    latest = pulled(engines(home, hub.url, "pull", TTS))
    assert (latest / "generation_config.json").read_bytes() == moved["generation_config.json"]
    assert hub.revisions_fetched() == {second}
    for revision in (first, "v1"):
        hub.seen.clear()
        pinned = pulled(engines(home, hub.url, "pull", TTS, "--revision", revision))
        assert pinned.name == first != second
        assert checkpoint_files(pinned) == files
        assert hub.revisions_fetched() <= {first}  # a tag too: its commit, as the repo info resolved it
    offline = engines(home, hub.url, "pull", TTS, "--revision", "v1", HF_HUB_OFFLINE="1")
    assert pulled(offline).name == first and "using the cached snapshot" in offline.stderr
    line = one_line(engines(home, hub.url, "pull", TTS, "--revision", "v9"), "pull")
    assert f"{TTS} has no revision 'v9'" in line


@pytest.mark.parametrize("given", ["HF_TOKEN", "login file", "HF_TOKEN_PATH"])
def test_the_token_reaches_the_hub(hub: Hub, checkpoints, tmp_path, given):
    hub.push(TTS, checkpoint_files(checkpoints(0)), gated=True, readers=(TOKEN,))
    hub.tokens.add(TOKEN)
    home = tmp_path / "home"
    env = {}
    if given == "HF_TOKEN":
        env["HF_TOKEN"] = TOKEN
    elif given == "login file":  # where `huggingface-cli login` writes it: $HF_HOME/token
        home.mkdir()
        (home / "token").write_text(TOKEN)
    else:
        (tmp_path / "elsewhere").write_text(TOKEN)
        env["HF_TOKEN_PATH"] = str(tmp_path / "elsewhere")
    assert (pulled(engines(home, hub.url, "pull", TTS, **env)) / "model.safetensors").is_file()
    assert hub.seen and {s.headers.get("authorization") for s in hub.seen} == {f"Bearer {TOKEN}"}


def test_a_gated_or_unknown_repo_is_one_line_saying_how_to_log_in(hub: Hub, checkpoints, tmp_path):
    hub.push(TTS, checkpoint_files(checkpoints(0)), gated=True, readers=(TOKEN,))
    hub.push("edged/private", checkpoint_files(checkpoints(0)), private=True, readers=(TOKEN,))
    hub.tokens.update({TOKEN, "hf_other"})
    home = tmp_path / "home"
    line = one_line(engines(home, hub.url, "export", "--checkpoint", TTS, "--out", str(tmp_path / "a")), "export")
    assert f"{TTS} is gated: accept its conditions at {hub.url}/{TTS}" in line and "huggingface-cli login" in line
    line = one_line(engines(home, hub.url, "pull", TTS, HF_TOKEN="hf_other"), "pull")
    assert f"{TTS} is gated and the token sent has no access: accept its conditions at {hub.url}/{TTS}" in line
    line = one_line(engines(home, hub.url, "pull", TTS, HF_TOKEN="hf_unknown"), "pull")
    assert f"{hub.url} does not know the token sent (401 Unauthorized)" in line and "huggingface-cli login" in line
    for repo in ("edged/private", "edged/absent"):
        line = one_line(engines(home, hub.url, "pull", repo), "pull")
        assert f"{repo}: no such repository on {hub.url}, or it is private or gated" in line
        assert "huggingface-cli login" in line
    line = one_line(engines(home, hub.url, "pull", "edged/private", HF_TOKEN="hf_other"), "pull")
    assert f"edged/private: no such repository on {hub.url}, or the token sent cannot read it" in line
    assert pulled(engines(home, hub.url, "pull", "edged/private", HF_TOKEN=TOKEN)).is_dir()


def test_a_download_cut_off_is_resumed_by_the_next_run(hub: Hub, checkpoints, tmp_path):
    """huggingface_hub reads a download in 10 MiB chunks and keeps what it wrote in a `.incomplete`
    blob; the weights here are 12 MiB, cut after 11 (`pull` does not read them)."""
    weights = np.random.default_rng(0).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    files = {**checkpoint_files(checkpoints(0)), "model.safetensors": weights}
    commit = hub.push(TTS, files)
    hub.cut["model.safetensors"] = 11 << 20
    home = tmp_path / "home"
    line = one_line(engines(home, hub.url, "pull", TTS), "pull")
    assert "the download broke off" in line and "run the command again to resume it" in line
    offline = one_line(engines(home, hub.url, "pull", TTS, "--revision", commit, HF_HUB_OFFLINE="1"), "pull")
    assert "lacks model.safetensors" in offline and "HF_HUB_OFFLINE=1" in offline

    snapshot = pulled(engines(home, hub.url, "pull", TTS))
    assert (snapshot / "model.safetensors").read_bytes() == weights
    gets = [s.headers.get("range") for s in hub.seen if s.method == "GET" and s.file == "model.safetensors"]
    assert len(gets) == 2 and gets[0] is None and gets[1] is not None, gets  # the second run resumes
    start = int(gets[1].removeprefix("bytes=").removesuffix("-"))
    assert gets[1] == f"bytes={start}-" and 0 < start <= 11 << 20


def test_with_the_cache_filled_a_snapshot_is_found_offline_and_with_the_hub_down(checkpoints, tmp_path):
    """HF_HUB_OFFLINE=1, and the hub down: the cached snapshot, said in one line. `export --checkpoint
    REPO` exports the snapshot `pull` finds (engines.hub.pull for both), so an export is not run again
    here (the README's model recipe runs one); a repo never fetched is one line either way."""
    home = tmp_path / "home"
    files = checkpoint_files(checkpoints(0))
    with hub_server() as hub:
        hub.push(TTS, files)
        snapshot = pulled(engines(home, hub.url, "pull", TTS))
        endpoint = hub.url
    offline = engines(home, endpoint, "pull", TTS, HF_HUB_OFFLINE="1")
    assert pulled(offline) == snapshot and checkpoint_files(snapshot) == files
    assert f"{TTS}@main: the hub was not asked (HF_HUB_OFFLINE=1); using the cached snapshot {snapshot}" in offline.stderr
    down = engines(home, endpoint, "pull", TTS)
    assert pulled(down) == snapshot
    assert f"the hub cannot be reached ({endpoint}: [Errno 111] Connection refused); using the cached snapshot" in down.stderr

    for env, why in (({}, f"the hub cannot be reached ({endpoint}: "),  # a repo never fetched
                     ({"HF_HUB_OFFLINE": "1"}, "the hub was not asked (HF_HUB_OFFLINE=1)")):
        line = one_line(engines(home, endpoint, "export", "--checkpoint", "edged/other", "--out", str(tmp_path / "x"),
                                **env), "export")
        assert f"edged/other@main is not in the cache ({home / 'hub'}) and {why}" in line
        assert line.endswith(f": pull it where the hub can be reached (edged-engines pull edged/other) and copy the "
                             f"cache ({home / 'hub'}) here, or export from a checkpoint directory (and there is no "
                             f"directory edged/other here)"), line


@pytest.fixture(scope="module")
def omni_shards(build_dir) -> tuple[Path, dict[str, bytes], str]:
    """A tiny Qwen3-Omni checkpoint, and the files of a repository of it: the weights in three shards
    with an index, the slow tokenizer's files and no tokenizer.json; and the shard no export reads
    (the thinker's tensors but its text embedding)."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from engines.tiny import build_tiny
    from engines.weights import INDEX

    source = build_tiny(build_dir / "hub-omni-ckpt", 0, 0, family_name="qwen3_omni")
    weights = load_file(str(source / "model.safetensors"))
    unread, talker, codec = (f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3))

    def shard(key: str) -> str:
        if key.startswith("code2wav."):
            return codec
        return unread if key.startswith("thinker.") and not key.startswith("thinker.model.embed_tokens.") else talker

    weight_map = {key: shard(key) for key in sorted(weights)}
    out = build_dir / "hub-omni-sharded"
    out.mkdir()
    for name in (unread, talker, codec):
        save_file({k: v for k, v in weights.items() if weight_map[k] == name}, str(out / name), metadata={"format": "pt"})
    (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    files = {p.name: p.read_bytes() for p in source.iterdir() if p.name not in ("model.safetensors", "tokenizer.json")}
    return source, {**files, **checkpoint_files(out), **EXTRA}, unread


def test_an_omni_checkpoint_is_fetched_without_the_shards_its_export_never_reads(hub: Hub, omni_shards, tmp_path):
    from tokenizers import Tokenizer

    from edged.artifact import load_artifact
    from engines.weights import INDEX

    source, files, unread = omni_shards
    hub.push(OMNI, files)
    home, out = tmp_path / "home", tmp_path / "art"
    done = engines(home, hub.url, "export", "--checkpoint", OMNI, "--out", str(out), "--max-seq", "64")
    assert done.returncode == 0, done.stderr
    assert load_artifact(out).family == "qwen3_omni"
    # quiet: a line per stage and one naming the artifact and what to run next; the libraries' warnings in a log
    assert done.stdout.splitlines()[-2:] == [
        f"edged-engines export: exporting {done.stdout.split('exporting ')[1].split(' to ')[0]} to {out}: the graphs, "
        f"tables and tokenizer",
        f"edged-engines export: wrote the artifact {out}; serve it with: edged serve --artifact {out}"]
    assert "warn" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    assert "warn" in (out / "export.log").read_text().lower()
    assert hub.revisions_fetched() == {hub.repos[OMNI].refs["main"]}
    shards = {name for name in files if name.endswith(".safetensors")} - {unread}
    tokenizer = {"tokenizer_config.json", "vocab.json", "merges.txt"}
    assert sorted(set(hub.files_fetched())) == sorted({"config.json", INDEX} | tokenizer | shards)
    assert unread not in hub.files_fetched("HEAD")
    made, original = Tokenizer.from_file(str(out / "tokenizer.json")), Tokenizer.from_file(str(source / "tokenizer.json"))
    for text in ("Hello, world! It's 2024.\n\nNew   line", "<|im_start|>user\nGrüße, 東京<|audio_pad|><|im_end|>"):
        assert made.encode(text).ids == original.encode(text).ids, text
