"""`status.model` says what a request may choose and how long a reply can be, and the daemon keeps to it:
a reply that nothing else stops ends with `length` exactly where the stated KV room runs out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from support.daemon import Daemon

from edged.artifact import load_artifact
from edged.client import Client

MAX_SEQ = 40
"""A KV cache this small fills within seconds of audio (greedy on the built-in model reaches no eos in it)."""


def small_cache(builtin_artifact, tmp_path):
    """The built-in artifact with a KV cache of MAX_SEQ rows (max_seq is the runtime's to size)."""
    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    manifest = json.loads((art / "artifact.json").read_text())
    manifest["limits"]["max_seq"] = MAX_SEQ
    (art / "artifact.json").write_text(json.dumps(manifest))
    return art


def test_a_reply_ends_with_length_where_status_says_the_longest_reply_ends(builtin_artifact, tmp_path):
    """1. status.model states the artifact's choices and its longest reply: the KV room the layout's
          shortest prompt (8 rows: role, codec prefix, codec_bos) leaves, 80 ms a frame.
       2. A streamed one-token reply with no speaker or language (that shortest prompt) ends with
          `length` at exactly that many ms.
       3. A whole-text reply with a speaker and a language ends each extra prefill row's 80 ms sooner.
       4. `edged status` and `edged voice list` say the same."""
    art = small_cache(builtin_artifact, tmp_path)
    artifact = load_artifact(art)
    daemon = Daemon(tmp_path, config=f'[daemon]\nartifact = "{art}"\n')
    try:
        with Client(daemon.endpoint) as client:
            model = client.status()["model"]
            streamed = client.speak("Hi", more_text=True, play=False)
            streamed.end()
            shortest = streamed.wait()
            whole = client.speak("Hello there, how are you?", voice="vivian", language="english", play=False).wait()
        edged = [sys.executable, "-m", "edged"]
        shown = subprocess.run([*edged, "status", "--endpoint", daemon.endpoint], capture_output=True, text=True,
                               timeout=60)
        listed = subprocess.run([*edged, "voice", "list", "--endpoint", daemon.endpoint], capture_output=True,
                                text=True, timeout=60)
        as_json = subprocess.run([*edged, "voice", "list", "--json", "--endpoint", daemon.endpoint],
                                 capture_output=True, text=True, timeout=60)
        assert daemon.terminate() == 0
    finally:
        daemon.close()

    dialects = {name: s.dialect for name, s in artifact.speakers.items() if s.dialect}
    assert model == {
        "type": "custom_voice", "sample_rate": 24000, "speakers": sorted(artifact.speakers),
        "speaker_dialects": dialects, "languages": sorted(artifact.languages),
        "dialects": sorted(dialects.values()), "instruct": True, "instruct_means": "style", "clone": True,
        "max_seq": MAX_SEQ, "fixed_rows": 8, "max_reply_ms": (MAX_SEQ - 8 + 1) * 80.0}, model

    talker = shortest.report["stages"][0]
    assert shortest.reason == "length" and talker["stopped"] == "length", shortest.report
    assert talker["prefill_rows"] == model["fixed_rows"]
    assert shortest.report["audio_ms"] == model["max_reply_ms"]

    talker = whole.report["stages"][0]
    extra = talker["prefill_rows"] - model["fixed_rows"]  # a speaker, a language, the text and its end row
    assert whole.reason == "length" and extra == 2 + talker["text_tokens"] + 1, whole.report
    assert whole.report["audio_ms"] == model["max_reply_ms"] - 80.0 * extra

    assert shown.returncode == 0, shown.stderr
    rows = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert rows["model"] == ("custom_voice: 6 speakers (2 with a dialect), 12 languages (2 dialects), "
                             "instruct style, cloning yes, longest reply 2.6 s")
    assert listed.returncode == 0, listed.stderr
    head, voices = listed.stdout.split("\n\n")
    lines = dict(line.split(None, 1) for line in head.splitlines())
    assert lines["languages"] == "auto, " + ", ".join(sorted(set(artifact.languages) - set(dialects.values())))
    assert lines["dialects"].startswith("beijing_dialect, sichuan_dialect")
    assert lines["instruct"] == "a style instruction (how the voice speaks)"
    assert lines["cloning"].startswith("yes") and lines["longest"].startswith("2.6 s")
    assert "dylan                    built-in, dialect beijing_dialect" in voices.splitlines()
    listing = json.loads(as_json.stdout)
    assert listing["model"] == model and [v["name"] for v in listing["voices"]] == sorted(artifact.speakers)
