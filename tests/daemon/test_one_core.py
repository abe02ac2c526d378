"""`edged synth` and the daemon run one step core: the same greedy request gives the same frames,
and the same PCM, whether it is synthesized offline or spoken through the daemon over the protocol."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from edged.client import Client

CASES = [
    ("The same request, offline and through the daemon.", "vivian", "english", 40),
    ("一样的请求，两条路。", "dylan", "chinese", 25),
    ("No voice, no language.", None, None, 30),
]


def synth(tmp_path, text: str, voice: str | None, language: str | None, frames: int) -> tuple[list, np.ndarray]:
    """`edged synth --greedy` as a user runs it: its codec frames and its PCM (16-bit WAV)."""
    from edged.audio.wav import read_wav

    codes, wav = tmp_path / "codes.json", tmp_path / "out.wav"
    args = ["synth", "--text", text, "--greedy", "--max-frames", str(frames), "--out", str(wav), "--codes", str(codes)]
    args += ["--speaker", voice] if voice else []
    args += ["--language", language] if language else []
    done = subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(codes.read_text())["frames"], read_wav(wav)[0]


def test_synth_and_the_daemon_make_the_same_frames(start_daemon, tmp_path):
    daemon = start_daemon()  # greedy: temperature 0, cp_temperature 0, repetition_penalty 1.0
    with Client(daemon.endpoint) as client:
        for text, voice, language, frames in CASES:
            offline, pcm = synth(tmp_path, text, voice, language, frames)
            utterance = client.speak(text, voice=voice, language=language, play=False, stream=True, format="s16le",
                                     max_audio_ms=frames * 80, report_codes=True)
            done = utterance.wait()
            assert done.reason == "length" and len(offline) == frames
            assert done.report["rvq_codes"] == offline, text
            assert np.array_equal(utterance.pcm, np.rint(pcm * 32767).astype(np.int16)), text
