"""`edged synth` as a user runs it: a subprocess on the built-in tiny artifact, with no torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edged.audio.wav import read_wav
from edged.cpu import this_cpu

BLOCK_TORCH = "import sys; sys.modules['torch'] = None; from edged.cli import main; sys.exit(main())"


def edged(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter in which `import torch` fails."""
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], capture_output=True, text=True, timeout=120)


def test_synth_writes_wav_and_codes(tmp_path: Path):
    wav, codes = tmp_path / "out.wav", tmp_path / "codes.json"
    done = edged("synth", "--text", "Hello from the command line.", "--out", str(wav), "--codes", str(codes),
                 "--greedy", "--max-frames", "12", "--speaker", "Vivian", "--language", "English")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["frames"] == 12 and report["reason"] == "length" and report["audio_ms"] == 960.0
    pcm, rate = read_wav(wav)
    data = json.loads(codes.read_text())
    assert rate == data["sample_rate"] == 24000
    assert len(pcm) == 12 * data["samples_per_frame"] == 12 * 1920
    assert len(data["frames"]) == 12 and all(len(f) == 4 for f in data["frames"])
    assert 0.01 < float(abs(pcm).max()) <= 1.0


def test_greedy_is_deterministic_and_seed_reproducible(tmp_path: Path):
    runs = {}
    for name, extra in (("g1", ["--greedy"]), ("g2", ["--greedy"]), ("s1", ["--seed", "5"]), ("s2", ["--seed", "5"])):
        out = tmp_path / f"{name}.json"
        done = edged("synth", "--text", "Same text.", "--out", str(tmp_path / f"{name}.wav"), "--codes", str(out),
                     "--max-frames", "10", *extra)
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads(out.read_text())["frames"]
    assert runs["g1"] == runs["g2"] and runs["s1"] == runs["s2"]


def test_speculative_verify_keeps_greedy_frames_and_reports_its_drafts(tmp_path: Path):
    runs = {}
    for window in ("0", "4"):
        out = tmp_path / f"w{window}.json"
        done = edged("synth", "--text", "Speculate on the residual groups.", "--out", str(tmp_path / "x.wav"),
                     "--codes", str(out), "--max-frames", "10", "--greedy", "--cp-spec-verify", window)
        assert done.returncode == 0, done.stderr
        talker = json.loads(done.stdout)["stages"][0]
        runs[window] = json.loads(out.read_text())["frames"], talker["cp_drafted"]
    assert runs["0"][0] == runs["4"][0]
    assert runs["0"][1] == 0 and runs["4"][1] == 10  # G = 4: per frame, one pass checks group 2's draft (group 3 after)


def test_the_vocoder_on_its_own_thread_writes_the_same_audio(tmp_path: Path):
    """`--threads vocoder=1` (the default: windows decode while the next frame computes) and
    `vocoder=0` (each window after its step, on generation's thread): the same frames, the same WAV."""
    runs = {}
    for plan in ("generation=1,vocoder=0", "vocoder=1"):
        wav, codes = tmp_path / f"{plan}.wav", tmp_path / f"{plan}.json"
        done = edged("synth", "--text", "One thread or two, the same audio.", "--out", str(wav), "--codes", str(codes),
                     "--greedy", "--max-frames", "30", "--threads", plan)
        assert done.returncode == 0, done.stderr
        runs[plan] = json.loads(codes.read_text())["frames"], wav.read_bytes(), json.loads(done.stdout)
    (frames0, wav0, report0), (frames1, wav1, report1) = runs.values()
    assert frames0 == frames1 and len(frames0) == 30 and wav0 == wav1
    assert report0["audio_ms"] == report1["audio_ms"] == 2400.0
    assert report0["stages"][1]["frames"] == report1["stages"][1]["frames"] == 30  # every frame vocoded


@pytest.mark.parametrize("args,message", [
    (["--text", "hi", "--threads", "vocodr=1"], "argument --threads: threads: unknown stage 'vocodr' (stages: "
                                                "clone_encoder, generation, vocoder; write STAGE=N[,STAGE=N...])"),
    (["--text", "hi", "--threads", "2"], "argument --threads: threads: unknown stage '2'"),
    (["--text", "hi", "--threads", "generation=0"], "generation and clone_encoder must be >= 1"),
    (["--text", "hi", "--speaker", "nobody"], "unknown voice 'nobody'"),
    (["--text", "hi", "--language", "klingon"], "unknown language 'klingon'"),
    (["--text", "   "], "text is empty"),
    (["--text", "word " * 600], "text too long: the prefill needs"),
    (["--text", "hi", "--max-frames", "0"], "max_frames must be >= 1"),
    (["--text", "hi", "--cp-spec-verify", "1"], "sampling.cp_spec_verify_size must be 0 (off) or an integer in 2..8"),
    (["--text", "hi", "--user-text", "hello?"], "context: this model (layout tts) takes no conversation context"),
    (["--text", "hi", "--artifact", "/nonexistent/artifact"], "no artifact.json"),
    (["--text", "hi", "--speaker", "vivian", "--ref-audio", "ref.wav"], "--speaker and --ref-audio both name the voice"),
    pytest.param(["--text", "hi", "--backend", "tensorrt"], "the tensorrt backend needs pycuda",
                 marks=pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda is here")),
])
def test_bad_input_exits_2_with_a_clear_error(tmp_path: Path, args, message):
    done = edged("synth", *args, "--out", str(tmp_path / "x.wav"))
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "x.wav").exists()


def test_runtime_never_imports_torch():
    code = ("import sys; sys.modules['torch'] = None; import edged.synth, edged.backends.onnxruntime, "
            "edged.cli; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_an_output_it_cannot_write_exits_2_naming_it(tmp_path: Path):
    done = edged("synth", "--text", "hi", "--max-frames", "1", "--out", str(tmp_path / "missing" / "x.wav"))
    assert done.returncode == 2 and done.stderr.startswith("edged synth: cannot write the output: ")
    assert "missing/x.wav" in done.stderr and "Traceback" not in done.stderr


def test_bench_times_each_batch_of_the_builtin_artifact():
    """`edged bench`: a row per batch (1 and the artifact's max_batch by default) whose frames/s, RTF
    and per-step figures agree with one another; a batch beyond max_batch exits 2."""
    done = edged("bench", "--frames", "8", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("edged bench: ") and lines[0].endswith(
        "talker and code predictor fp32 network, fp32 weights; vocoder: fp32 (the artifact's only vocoder)")
    assert lines[1] == f"cpu: {this_cpu().line()}, {os.cpu_count()} logical cores"
    assert lines[2].startswith("backend onnxruntime") and "threads generation=1,vocoder=1" in lines[2]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ") and
            line[2].isdigit()]
    assert [r[0] for r in rows] == ["1", "4"]
    for batch, rtf, fps, ratio, gen, voc, first, spread in rows:
        assert float(rtf) > 0 and float(fps) > 0 and float(gen) > 0 and float(voc) > 0 and float(first) > 0
        assert float(ratio) > 0 and spread.endswith("%")
        # frames/s of the cohort = batch members x a frame each step; RTF = wall / one member's audio
        assert abs(float(fps) * float(rtf) * 0.08 - int(batch)) < 0.05 * int(batch)
    assert rows[0][3] == "1.00"
    refused = edged("bench", "--batch", "9")
    assert refused.returncode == 2 and "--batch must be in 1..4" in refused.stderr
