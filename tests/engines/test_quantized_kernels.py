"""The quantized weights' products on a CPU without VNNI: ONNX Runtime's MatMulNBits at the daemon's
accuracy level 4 quantizes activations to signed int8 (|a| <= 127), so even an AVX2 pair sum of
int8 weights stays inside 16 bits (2 x 127 x 128 = 32512), unlike the int8 vocoder's uint8 activations.
Checked where it matters: greedy frames under Haswell's kernels (qemu: tests/support/emulated.py)
equal this CPU's, for both weight forms."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.emulated import SATURATING, qemu

from engines.quantize import quantize_artifact

TEXT = "Hello there, how are you today?"


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_quantized_weights_make_the_same_frames_on_a_cpu_without_vnni(builtin_artifact, tmp_path, weights):
    if qemu() is None:
        pytest.skip("needs qemu-x86_64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)")
    art = tmp_path / weights
    quantize_artifact(builtin_artifact, art, weights)
    frames = {}
    for where, prefix in (("here", []), ("haswell", [qemu(), "-cpu", SATURATING])):
        codes = tmp_path / f"{where}.json"
        done = subprocess.run([*prefix, sys.executable, "-m", "edged", "synth", "--artifact", str(art), "--text", TEXT,
                               "--speaker", "vivian", "--greedy", "--max-frames", "12", "--out",
                               str(tmp_path / f"{where}.wav"), "--codes", str(codes)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        frames[where] = json.loads(codes.read_text())["frames"]
    assert len(frames["here"]) == 12
    assert frames["haswell"] == frames["here"]
