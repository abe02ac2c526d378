"""The clone encoder beside a TensorRT synthesis: `edged-engines plans` builds no plan for the speaker
and codec encoders, and `edged synth --backend tensorrt --ref-audio` runs them on ONNX Runtime (as the
daemon's voice thread does), so they never touch the TensorRT backend or size its activation block;
run as the CLI under the TensorRT doubles (tests/support/with_fake_trt.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from support import fake_trt

from edged.audio.wav import read_wav, write_wav

ROOT = Path(__file__).resolve().parents[2]


def test_synth_with_a_reference_on_tensorrt_clones_on_onnx_runtime(monkeypatch, builtin_artifact, tmp_path):
    fake_trt.install(monkeypatch)
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    plans = build_plans(art)
    assert sorted(p.name for p in plans) == ["code_predictor.plan", "code_predictor_draft.plan", "talker.plan",
                                             "vocoder.plan"]
    t = np.arange(int(2.0 * 24000)) / 24000
    write_wav(tmp_path / "ref.wav", (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, str(ROOT / "tests/support/with_fake_trt.py"), fake_trt.__version__, "synth",
                           "--artifact", str(art), "--backend", "tensorrt", "--text", "Cloned on the side.",
                           "--ref-audio", str(tmp_path / "ref.wav"), "--ref-text", "the reference",
                           "--greedy", "--max-frames", "6", "--out", str(tmp_path / "out.wav")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    cpu = subprocess.run([sys.executable, "-m", "edged", "synth", "--artifact", str(art), "--backend", "onnxruntime",
                          "--text", "Cloned on the side.", "--ref-audio", str(tmp_path / "ref.wav"), "--ref-text",
                          "the reference", "--greedy", "--max-frames", "6", "--out", str(tmp_path / "cpu.wav")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert cpu.returncode == 0, cpu.stderr
    pcm, rate = read_wav(tmp_path / "out.wav")
    want, _ = read_wav(tmp_path / "cpu.wav")
    assert rate == 24000 and report["frames"] == 6 == json.loads(cpu.stdout.splitlines()[-1])["frames"], report
    # the same clone, the same greedy frames: the same audio as ONNX Runtime's, sample for sample (16-bit WAV)
    assert len(pcm) == len(want) > 0 and np.abs(pcm - want).max() <= 2 / 32768

