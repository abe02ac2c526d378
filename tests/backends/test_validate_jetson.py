"""scripts/validate_jetson.py's rows that a device decides, checked here on what they read: the engine
inspector's layers of an int4 plan (INT4 weights feeding GEMMs, or dequantized by a layer of their own
at run time), the soak run directly (the dry run on ONNX Runtime: 4 clients, boot time, SIGTERM), and
the drop-in that runs the soak under the installed edged.service, verified with the unit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import validate_jetson
    import validate_service
finally:
    sys.path.remove(str(ROOT / "scripts"))


def layer(name: str, kind: str, inputs: list[str], outputs: list[str], weights: str | None = None) -> dict:
    """One layer as LayerInformationFormat.JSON prints it for a DETAILED plan (the fields trt-engine-explorer
    reads: Name, LayerType, Inputs/Outputs with Format/Datatype, Weights with Type)."""
    found = {"Name": name, "LayerType": kind,
             "Inputs": [{"Name": f"{name}_in{i}", "Format/Datatype": f} for i, f in enumerate(inputs)],
             "Outputs": [{"Name": f"{name}_out{i}", "Format/Datatype": f} for i, f in enumerate(outputs)]}
    if weights:
        found["Weights"] = {"Type": weights, "Count": 1024}
    return found


def test_the_int4_row_reads_the_inspectors_layers():
    fused = {"Layers": [layer("attn.q_proj", "gemm", ["Row major linear FP16 format"], ["Row major linear FP16 format"],
                              weights="Int4"),
                        layer("norm", "Myelin", ["Row major linear FP32 format"], ["Row major linear FP32 format"])]}
    ok, detail = validate_jetson.int4_evidence(json.dumps(fused))
    assert ok and detail == "2 layers; 1 GEMM layers take INT4 weights; 0 layers dequantize INT4 on their own"
    unfused = {"Layers": [layer("q_proj.DequantizeLinear", "Dequantize", ["Row major linear Int4 format"],
                                ["Row major linear FP16 format"]),
                          layer("attn.q_proj", "gemm", ["Row major linear FP16 format", "Row major linear Int4 format"],
                                ["Row major linear FP16 format"])]}
    ok, detail = validate_jetson.int4_evidence(json.dumps(unfused))
    assert not ok and detail.endswith("1 layers dequantize INT4 on their own (e.g. q_proj.DequantizeLinear)")
    no_int4 = {"Layers": [layer("attn.q_proj", "gemm", ["Row major linear FP16 format"], ["x"], weights="Half")]}
    assert validate_jetson.int4_evidence(json.dumps(no_int4)) == (
        False, "1 layers; 0 GEMM layers take INT4 weights; 0 layers dequantize INT4 on their own")
    names_only = {"Layers": ["attn.q_proj", "norm"], "Bindings": ["inputs_embeds"]}  # LAYER_NAMES_ONLY
    assert validate_jetson.int4_evidence(json.dumps(names_only)) == (
        False, "no detailed layer information (the plan was built without ProfilingVerbosity.DETAILED)")


def test_the_direct_soak_serves_every_request_and_exits_0_on_sigterm(builtin_artifact):
    summary = validate_jetson.Summary()
    validate_jetson.soak(builtin_artifact, "onnxruntime", 1, summary, service=False)
    rows = {check: (verdict, detail) for check, verdict, detail in summary.rows}
    assert rows["soak"][0] == "PASS" and rows["soak"][1].startswith("python -m edged serve: 4/4 done in "), rows
    assert rows["boot time"][0] == "PASS", rows
    assert rows["SIGTERM"] == ("PASS", "python -m edged serve: exit code 0; backend closed: True")


def test_the_service_soak_drop_in_verifies_with_the_installed_unit(tmp_path):
    """The unit with the soak's drop-in applied (ExecStart reset, then the installed binary with the
    soak's config and a loopback endpoint) verifies cleanly; the soak's config names the artifact copy
    and allows the tcp endpoint (daemon.insecure_tcp)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze missing: run scripts/install-system-deps.sh (Debian package systemd)")
    shim = tmp_path / "edged"
    shim.write_text("#!/bin/sh\n")
    shim.chmod(0o755)
    unit = (ROOT / "systemd/edged.service").read_text().replace("ExecStart=/opt/edged/bin/edged ", f"ExecStart={shim} ")
    endpoint = "tcp://127.0.0.1:40123"
    dropin = validate_service.dropin(str(shim), validate_service.PLACE / "edged.toml", endpoint)
    assert dropin == (f"[Service]\nExecStart=\nExecStart={shim} serve --config {validate_service.PLACE}/edged.toml "
                      f"--listen {endpoint}\n")
    (tmp_path / "edged.service").write_text(unit + "\n" + dropin)  # a drop-in's sections, applied after the unit's
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "edged.service")], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    config = validate_service.config("tensorrt", validate_service.PLACE / "artifact", tcp=True)
    (tmp_path / "edged.toml").write_text(config)
    from edged.config import load_config

    cfg = load_config(tmp_path / "edged.toml")
    assert cfg.daemon.backend == "tensorrt" and cfg.daemon.insecure_tcp and cfg.audio.device == "none"
    assert cfg.daemon.artifact == str(validate_service.PLACE / "artifact")


def test_the_int4_rows_through_the_doubles(trt, builtin_artifact, tmp_path):
    """The int4 rows read real plans: their sizes (the doubles' plans hold the weights as TensorRT
    keeps them, INT4 packed), the inspector's layers (the double fuses nothing, so its INT4
    DequantizeLinear layers stand alone: the row fails, naming one) and the talker's ms per frame."""
    from engines.fp16 import convert_artifact
    from engines.quantize import quantize_artifact
    from engines.tensorrt import build_plans

    fp16, int4 = tmp_path / "fp16", tmp_path / "int4"
    convert_artifact(builtin_artifact, fp16)
    quantize_artifact(builtin_artifact, int4, "int4", "jetson", block=64)
    build_plans(fp16)
    build_plans(int4)
    summary = validate_jetson.Summary()
    validate_jetson.int4_plans(fp16, int4, "tensorrt", summary)
    rows = {check: (verdict, detail) for check, verdict, detail in summary.rows}
    size = rows["int4 plan size"]
    ratio = float(size[1].split("(")[1].split(";")[0])
    assert size[0] == ("PASS" if ratio <= validate_jetson.INT4_SIZE else "FAIL") and ratio < 1, size
    gemms = rows["int4 GEMMs (engine inspector)"]
    assert gemms[0] == "FAIL" and re.match(r"\d+ layers; 0 GEMM layers take INT4 weights; \d+ layers dequantize INT4 "
                                           r"on their own \(e\.g\. talker\.", gemms[1]), gemms
    assert (int4 / "talker.layers.json").is_file()
    assert re.fullmatch(r"talker [\d.]+ ms per frame at int4, [\d.]+ ms at fp16 \(no worse\)", rows["int4 talker speed"][1])
