"""The daemon on the TensorRT backend, booted as systemd would (NOTIFY_SOCKET) over the TensorRT,
pycuda and CUDA doubles (tests/support/with_fake_trt.py): a boot that extends systemd's start timeout
while it loads engines, binds plans and captures graphs (EXTEND_TIMEOUT_USEC before READY=1), and a
capture that fails is named, plan by plan, in the log, in `status.backend.cuda_graphs` and in
`edged status`, while the daemon serves with that plan enqueued."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support import fake_trt
from support.daemon import Daemon

from edged.client import Client

ROOT = Path(__file__).resolve().parents[2]


def test_a_boot_on_tensorrt_extends_its_start_timeout_and_names_a_failed_capture(monkeypatch, builtin_artifact,
                                                                                tmp_path):
    fake_trt.install(monkeypatch)
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    build_plans(art)
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    daemon = Daemon(tmp_path, config=f'[daemon]\nbackend = "tensorrt"\nartifact = "{art}"\n', ready_s=240,
                    command=(sys.executable, str(ROOT / "tests/support/with_fake_trt.py"), fake_trt.__version__),
                    env={"PYTHONPATH": path, "EDGED_TEST_CAPTURE_UNSAFE": "code_predictor.onnx"})
    try:
        boot = daemon.messages[:daemon.messages.index("READY=1")]
        assert "EXTEND_TIMEOUT_USEC=60000000" in boot, boot
        assert [m for m in boot if m.startswith("STATUS=booting: ")] == [
            "STATUS=booting: loading the engines",
            "STATUS=booting: claiming buffers, binding plans, capturing CUDA graphs", "STATUS=booting: warming up"]
        with Client(daemon.endpoint, timeout_s=60) as client:
            graphs = client.status()["backend"]["cuda_graphs"]
            done = client.speak("Served without some graphs.", play=False, max_audio_ms=800).wait()
        assert done.reason in ("eos", "length"), done
        assert graphs["enabled"] and graphs["failed"] and graphs["captured"] > 0
        assert graphs["captured"] + len(graphs["failed"]) == graphs["marked"]
        assert all(f["plan"].startswith("code_predictor.onnx (pass of ") and f["why"] ==
                   "code_predictor.onnx: execute_async_v3 failed" for f in graphs["failed"])
        log = daemon.read_log()
        first = graphs["failed"][0]["plan"]
        assert f"no CUDA graph for {first}: code_predictor.onnx: execute_async_v3 failed; it is enqueued per run " \
               f"instead" in log
        assert (f"CUDA graphs: {graphs['captured']} of {graphs['marked']} step plans captured; "
                f"{len(graphs['failed'])} enqueued per run instead") in log
        shown = subprocess.run([sys.executable, "-m", "edged", "status", "--endpoint", daemon.endpoint],
                               capture_output=True, text=True, timeout=60)
        row = next(line for line in shown.stdout.splitlines() if line.startswith("backend"))
        assert f"tensorrt, {graphs['captured']} of {graphs['marked']} step plans replayed as CUDA graphs; " \
               f"NOT CAPTURED {first}: " in row, shown.stdout
        assert daemon.terminate() == 0
    finally:
        daemon.close()
