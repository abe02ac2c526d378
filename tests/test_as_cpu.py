"""scripts/bench/as_cpu.py: a command run under it sees the class's CPUID, and ONNX Runtime runs that
class's kernels natively: on the avx2 class its uint8 x int8 products saturate 16-bit pair sums
(vpmaddubsw), which this machine's own kernels may not."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from support.cpuinfo import cpuinfo_flags

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "scripts" / "bench" / "as_cpu.py"


pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or "cpuid_fault" not in cpuinfo_flags(),
                                reason="needs an x86-64 CPU with CPUID faulting (/proc/cpuinfo flag cpuid_fault)")

PROBE = "import json; from edged.cpu import this_cpu; print(json.dumps(this_cpu().to_json()))"

PRODUCTS = """
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
k = 64
graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "products",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k]),
                           helper.make_tensor_value_info("b", TensorProto.INT8, [k, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 16])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
y = session.run(None, {"a": np.full((1, k), 255, np.uint8), "b": np.full((k, 16), 127, np.int8)})[0]
print(int(y[0, 0]))
"""
EXACT = 64 * 255 * 127
SATURATED = 32 * 32767  # 32 pairs, each 255 * 127 * 2 clamped to int16's largest


def _under(cls: str | None, code: str) -> str:
    command = [sys.executable, "-c", code]
    if cls is not None:
        command = [sys.executable, str(RUNNER), cls, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("cls, features, kernel", [
    ("avx2", ["avx2", "fma"], "avx2"),
    ("avx512", ["avx2", "fma", "avx512f", "avx512_core"], "avx512"),
])
def test_a_command_sees_the_class_cpuid(cls, features, kernel):
    here = json.loads(_under(None, PROBE))
    if not set(features) <= set(here["features"]):
        pytest.skip(f"this CPU lacks the {cls} class's features: {here['features']}")
    cpu = json.loads(_under(cls, PROBE))
    assert (cpu["features"], cpu["int8_products"], cpu["model"]) == (features, kernel, here["model"])


def test_onnx_runtime_runs_the_avx2_class_kernels():
    assert int(_under("avx2", PRODUCTS)) == SATURATED
    here = json.loads(_under(None, PROBE))
    if not here["int8_saturates"]:
        assert int(_under(None, PRODUCTS)) == EXACT


def test_the_programs_own_segv_handler_keeps_its_faults():
    """faulthandler (pytest, `edged serve`) installed after the mask: CPUIDs are still answered, and a
    real fault still reaches faulthandler's traceback and kills the process as without the mask."""
    cpu = json.loads(_under("avx2", "import faulthandler; faulthandler.enable(); " + PROBE))
    assert cpu["int8_products"] == "avx2"
    fault = [sys.executable, str(RUNNER), "avx2", "--", sys.executable, "-X", "faulthandler", "-c",
             "import ctypes; ctypes.string_at(0)"]
    done = subprocess.run(fault, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == -11 and "Fatal Python error: Segmentation fault" in done.stderr, done.stderr


def test_a_bad_mask_is_named():
    done = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True, timeout=60,
                          env={"LD_PRELOAD": str(_library()), "EDGED_CPUID_CLEAR": "7.0.zzz=1"})
    assert done.returncode == 3 and "EDGED_CPUID_CLEAR register not one of eax ebx ecx edx: 7.0.zzz=1" in done.stderr


def _library() -> Path:
    sys.path.insert(0, str(RUNNER.parent))
    try:
        import as_cpu
    finally:
        sys.path.remove(str(RUNNER.parent))
    return as_cpu.library()
