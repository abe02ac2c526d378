"""Plan files (edged/backends/plan_file.py) through the TensorRT doubles: the boot checks what a plan
was built from by its files' sizes and times and reads no byte of the weights; a changed file is
refused with the rebuild command; `edged-engines plans --verify` re-hashes on request; the engine
starts on a page, and a plan whose engine does not (the old format) is refused."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from support import fake_trt

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.backends.plan_file import ALIGN

OPENED: list[str] | None = None
"""Paths Python opens while a test records them (an audit hook cannot be removed, so it checks this)."""


def _record_opens(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)


@pytest.fixture
def external(trt, builtin_artifact, tmp_path) -> Path:
    """A copy of the built-in artifact whose vocoder keeps its weights in vocoder.onnx.data (as every
    real-size talker does), with plans."""
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    vocoder = art / "vocoder.onnx"
    onnx.save_model(onnx.load(str(vocoder)), str(vocoder), save_as_external_data=True, location="vocoder.onnx.data")
    build_plans(art)
    return art


def test_the_boot_reads_no_byte_of_the_graph_or_its_weights(trt, external):
    """Loading a plan opens the plan and nothing of what it was built from: the stamp is checked by
    sizes and times. The same bytes changed in place with the time put back: the boot takes it (it did
    not read them), and `plans --verify`, which re-hashes, refuses it."""
    from engines.cli import main as engines_main

    global OPENED
    vocoder = external / "vocoder.onnx"
    backend = trt.TrtBackend()
    try:
        OPENED = []
        backend.load(vocoder)
        opened, OPENED = OPENED, None
        assert str(external / "vocoder.plan") in opened
        assert not [p for p in opened if p.endswith((".onnx", ".onnx.data"))], opened
        data = external / "vocoder.onnx.data"
        before = data.stat()
        weights = bytearray(data.read_bytes())
        weights[len(weights) // 2] ^= 0x40  # other weights, same size
        data.write_bytes(bytes(weights))
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
        backend.load(vocoder)  # the boot cannot tell: it reads no weights
    finally:
        OPENED = None
        backend.close()
    assert engines_main(["plans", "--verify", str(external)]) == 2


def test_a_changed_or_replaced_weight_file_is_refused_with_the_rebuild_command(trt, external, capsys):
    from engines.cli import main as engines_main

    vocoder, data = external / "vocoder.onnx", external / "vocoder.onnx.data"
    assert engines_main(["plans", "--verify", str(external)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["talker.plan: ok", "code_predictor.plan: ok", "code_predictor_draft.plan: ok", "vocoder.plan: ok"]
    stamp = data.stat()
    backend = trt.TrtBackend()
    try:
        backend.load(vocoder)
        os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))  # touched
        with pytest.raises(EngineError, match=r"vocoder\.plan: built from another vocoder\.onnx \(or its external "
                                              r"data\) than the artifact's: vocoder\.onnx\.data was modified after the "
                                              r"plan was built \(rebuild the plans on this device: edged-engines plans"):
            backend.load(vocoder)
        assert engines_main(["plans", "--verify", str(external)]) == 2
        assert capsys.readouterr().out.splitlines()[-1] == (
            "vocoder.plan: the same bytes, but vocoder.onnx.data was modified after the plan was built: the boot "
            "refuses it (rebuild the plans on this device: edged-engines plans ARTIFACT)")
        replacement = external / "replacement"
        replacement.write_bytes(data.read_bytes() + b"\0" * 64)
        os.replace(replacement, data)  # replaced by a larger file
        os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        with pytest.raises(EngineError, match=rf"vocoder\.onnx\.data is {stamp.st_size + 64} bytes, was "
                                              rf"{stamp.st_size} \(rebuild"):
            backend.load(vocoder)
        data.unlink()
        with pytest.raises(EngineError, match=r"vocoder\.onnx\.data is gone \(rebuild"):
            backend.load(vocoder)
    finally:
        backend.close()


def test_the_engine_starts_on_a_page_and_an_old_format_plan_is_refused(trt, external):
    plan = external / "talker.plan"
    raw = plan.read_bytes()
    head, _, engine = raw.partition(b"\n")
    assert (len(head) + 1) % ALIGN == 0 and raw[len(head) + 1:].startswith(fake_trt.MAGIC)
    header = json.loads(head)
    assert header["onnx_sha256"] and header["built_from"] == [
        {"file": "talker.onnx", "size": (external / "talker.onnx").stat().st_size,
         "mtime_ns": (external / "talker.onnx").stat().st_mtime_ns}]
    plan.write_bytes(json.dumps(header).encode() + b"\n" + engine)  # the same stamp, the engine where it falls
    backend = trt.TrtBackend()
    try:
        with pytest.raises(EngineError, match=r"talker\.plan: an old-format plan \(its engine is not page-aligned, "
                                              r"or it has no stamp of what it was built from\) \(rebuild the plans"):
            backend.load(load_artifact(external).file("talker"))
    finally:
        backend.close()


def test_the_boot_time_row_states_what_reading_the_plans_costs(external):
    """validate_jetson's boot row: the daemon's boot seconds, and the artifact's plan bytes at microSD
    (40-90 MB/s) and NVMe (1-2 GB/s) read rates, the one read a boot makes of them."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    try:
        import validate_jetson
    finally:
        sys.path.remove(str(root / "scripts"))
    summary = validate_jetson.Summary()
    validate_jetson.boot_time(f"serving qwen3_tts on ipc:///x (artifact {external}, max_batch 4, 60 CUDA graphs, "
                              f"boot 12.5 s)", summary)
    mb = sum(p.stat().st_size for p in external.glob("*.plan")) / 1e6
    assert summary.rows == [("boot time", "PASS", f"12.5 s (60 CUDA graphs captured); TimeoutStartSec 180 s; plans "
                                                  f"{mb:.0f} MB: {mb / 90:.1f}-{mb / 40:.1f} s to read from microSD, "
                                                  f"{mb / 2000:.1f}-{mb / 1000:.1f} s from NVMe")]
