"""The daemon on an artifact with an int8 vocoder: one boot line and `status` name the CPU and the
vocoder that runs, and on a CPU whose uint8 x int8 products saturate (Haswell's kernels under qemu:
tests/support/emulated.py) that is the uint8 twin, whose audio the client gets within the int8
vocoder's bound of the fp32 vocoder's (the saturating int8 twin is far below it)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support.emulated import SATURATING, SNR_DB, qemu, snr_db

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.client import Client
from edged.cpu import DOT, this_cpu
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.quantize import quantize_artifact

TEXT = "Hello there, how are you today?"


@pytest.fixture(scope="module")
def int8_artifact(tmp_path_factory, builtin_artifact):
    out = tmp_path_factory.mktemp("vocoder-int8")
    quantize_artifact(builtin_artifact, out, None, vocoder="int8")
    return out


def _served(daemon, frames: int = 12) -> tuple[dict, np.ndarray]:
    with Client(daemon.endpoint, timeout_s=300) as client:
        status = client.status()
        utterance = client.speak(TEXT, voice="vivian", play=False, stream=True, max_audio_ms=frames * 80)
        done = utterance.wait()
        assert done.reason == "length", done
        return status, utterance.pcm


def _fp32_pcm(builtin_artifact, frames: int = 12) -> np.ndarray:
    request = SpeechRequest("v", TEXT, voice="vivian", sampling=Sampling.greedy(), max_frames=frames)
    return Synthesizer(load_artifact(builtin_artifact), make_backend("onnxruntime", 1)).synthesize([request])[0].pcm


def test_on_this_cpu_the_boot_line_and_status_name_the_vocoder_the_rule_picks(start_daemon, int8_artifact):
    daemon = start_daemon(config=f'[daemon]\nartifact = "{int8_artifact}"\n')
    status, pcm = _served(daemon)
    role = {"vocoder_int8": this_cpu().int8_products in DOT, "vocoder_uint8": this_cpu().int8_saturates}
    role = next((r for r, here in role.items() if here), "vocoder")
    weights = "fp32" if role == "vocoder" else "int8"
    assert (status["vocoder"]["weights"], status["vocoder"]["role"]) == (weights, role)
    assert status["cpu"] == this_cpu().to_json()
    log = daemon.read_log()
    assert f"cpu: {this_cpu().line()}" in log
    assert f"vocoder: {weights} ({status['vocoder']['why']})" in log
    assert pcm.size > 0 and np.isfinite(pcm).all()
    shown = subprocess.run([sys.executable, "-m", "edged", "status", "--endpoint", daemon.endpoint],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert rows["cpu"] == this_cpu().line()
    assert rows["vocoder"] == f"{weights} ({status['vocoder']['why']})"


def test_on_a_saturating_cpu_the_daemon_serves_the_uint8_twin_and_says_why(start_daemon, int8_artifact,
                                                                           builtin_artifact):
    if qemu() is None:
        pytest.skip("needs qemu-x86_64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)")
    daemon = start_daemon(config=f'[daemon]\nartifact = "{int8_artifact}"\n', wrap=(qemu(), "-cpu", SATURATING),
                          ready_s=300)
    status, pcm = _served(daemon)
    why = ("uint8 weights: this CPU's uint8 x int8 products (avx2, no VNNI) saturate 16-bit sums, its uint8 x uint8 "
           "ones do not")
    assert status["vocoder"] == {"weights": "int8", "role": "vocoder_uint8", "why": why}
    assert (status["cpu"]["int8_products"], status["cpu"]["int8_saturates"]) == ("avx2", True)
    assert "Haswell" in status["cpu"]["model"]
    log = daemon.read_log()
    assert f"vocoder: int8 ({why})" in log and "int8 products: avx2)" in log
    want = _fp32_pcm(builtin_artifact)
    assert pcm.shape == want.shape
    assert snr_db(want, pcm) >= SNR_DB
