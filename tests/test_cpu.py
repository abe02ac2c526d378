"""The CPU as the kernels see it (edged/cpu.py) and the vocoder form it decides (edged/vocoder/form.py):
the probe against the kernel's own flags here and against qemu's CPU models, the kernel rules of
ONNX Runtime's MLAS, and the form each CPU class runs."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from support.cpuinfo import cpuinfo_flags
from support.emulated import EXACT, SATURATING, qemu

from edged.artifact import load_artifact
from edged.cpu import Cpu, classify_arm64, classify_x86, this_cpu

FLAGS = {"avx2": "avx2", "fma": "fma", "avx_vnni": "avx_vnni", "avx512f": "avx512f", "avx512_vnni": "avx512_vnni",
         "avx512_bf16": "avx512_bf16", "amx_int8": "amx_int8"}
"""Our feature name -> the kernel's /proc/cpuinfo flag (both read CPUID; the kernel also masks what it
does not save, as our XGETBV check does)."""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 CPUID probe")
def test_the_probe_reads_what_the_kernel_reads_on_this_cpu():
    if "EDGED_CPUID_CLEAR" in os.environ:
        pytest.skip("CPUID is masked (scripts/bench/as_cpu.py): the kernel's flags are the host's")
    flags = cpuinfo_flags()
    cpu = this_cpu()
    assert {f for f in FLAGS if f in cpu.features} == {f for f, flag in FLAGS.items() if flag in flags}
    assert ("avx512_core" in cpu.features) == ({"avx512bw", "avx512dq", "avx512vl"} <= flags)
    model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name"))
    assert cpu.model == model
    assert cpu.int8_products == classify_x86(set(cpu.features))


@pytest.mark.parametrize("model, kernel, features", [
    (SATURATING, "avx2", ["avx2", "fma"]),
    ("EPYC-Milan", "avx2", ["avx2", "fma"]),
    (EXACT, "sse", []),
])
def test_the_probe_reads_an_emulated_cpus_cpuid_not_the_hosts(model, kernel, features):
    """Under qemu the instructions report the model's CPUID while /proc/cpuinfo still shows the host's:
    the kernels follow the instructions, and so must the probe."""
    if qemu() is None:
        pytest.skip("needs qemu-x86_64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)")
    done = subprocess.run([qemu(), "-cpu", model, sys.executable, "-c",
                           "import json; from edged.cpu import this_cpu; print(json.dumps(this_cpu().to_json()))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    cpu = json.loads(done.stdout)
    assert (cpu["int8_products"], cpu["features"], cpu["int8_saturates"]) == (kernel, features, kernel == "avx2")
    assert "QEMU" in cpu["model"] or model.split("-")[0] in cpu["model"]


@pytest.mark.parametrize("features, kernel", [
    (set(), "sse"),
    ({"avx2"}, "sse"),  # MLAS needs FMA beside AVX2
    ({"avx2", "fma"}, "avx2"),
    ({"avx2", "fma", "avx_vnni"}, "avx-vnni"),
    ({"avx2", "fma", "avx512f", "avx512_core"}, "avx512"),
    ({"avx2", "fma", "avx_vnni", "avx512f", "avx512_core"}, "avx512"),  # AVX-512 core overrides AVX-VNNI
    ({"avx2", "fma", "avx512f"}, "avx2"),  # no BW/DQ/VL: not the AVX-512 core kernel
    ({"avx2", "fma", "avx512f", "avx512_core", "avx512_vnni"}, "avx512-vnni"),
    ({"avx2", "fma", "avx512f", "avx512_core", "avx512_vnni", "amx_int8"}, "amx"),
])
def test_the_x86_kernel_is_the_one_mlas_picks(features, kernel):
    assert classify_x86(features) == kernel


@pytest.mark.parametrize("features, kernel", [
    ({"neon"}, "neon"), ({"neon", "dotprod"}, "neon-dot"), ({"neon", "dotprod", "i8mm"}, "neon-i8mm")])
def test_the_arm64_kernel_is_the_one_mlas_picks(features, kernel):
    assert classify_arm64(features) == kernel


SATURATES = "this CPU's uint8 x int8 products ({}, no VNNI) saturate 16-bit sums"


@pytest.mark.parametrize("kernel, role, why", [
    ("avx512-vnni", "vocoder_int8", "avx512-vnni 8-bit products on this CPU"),
    ("avx-vnni", "vocoder_int8", "avx-vnni 8-bit products on this CPU"),
    ("amx", "vocoder_int8", "amx 8-bit products on this CPU"),
    ("neon-dot", "vocoder_int8", "neon-dot 8-bit products on this CPU"),
    ("neon-i8mm", "vocoder_int8", "neon-i8mm 8-bit products on this CPU"),
    ("avx2", "vocoder_uint8", "uint8 weights: " + SATURATES.format("avx2") + ", its uint8 x uint8 ones do not"),
    ("avx512", "vocoder_uint8", "uint8 weights: " + SATURATES.format("avx512") + ", its uint8 x uint8 ones do not"),
    ("neon", "vocoder", "the int8 vocoder is not run: this CPU has no 8-bit dot-product instructions (neon), so int8 "
                        "is no faster than fp32"),
    ("sse", "vocoder", "the int8 vocoder is not run: this CPU has no 8-bit dot-product instructions (sse), so int8 "
                       "is no faster than fp32"),
])
def test_each_cpu_class_runs_the_vocoder_form_that_is_right_and_fast_there(builtin_artifact, kernel, role, why):
    from edged.vocoder.form import VocoderForm, choose_vocoder

    cpu = Cpu("a CPU", "x86_64", (), kernel)
    fp32 = load_artifact(builtin_artifact)
    twins = {twin: replace(fp32.graphs["vocoder"], file=f"{twin}.onnx") for twin in ("vocoder_int8", "vocoder_uint8")}
    int8 = replace(fp32, vocoder_weights="int8", graphs={**fp32.graphs, **twins})
    form = choose_vocoder(int8, "onnxruntime", cpu)
    weights = "fp32" if role == "vocoder" else "int8"
    assert (form.weights, form.role, form.why) == (weights, role, why)
    assert form.line() == f"vocoder: {weights} ({why})"
    assert choose_vocoder(fp32, "onnxruntime", cpu).role == "vocoder"
    # an int8 artifact quantized before the uint8 twin: the saturating classes run its fp32 vocoder
    older = replace(int8, graphs={**fp32.graphs, "vocoder_int8": twins["vocoder_int8"]})
    if role == "vocoder_uint8":
        assert choose_vocoder(older, "onnxruntime", cpu) == VocoderForm(
            "fp32", "vocoder", f"the int8 vocoder is not run: {SATURATES.format(kernel)}, and this artifact has no uint8 "
                               f"form of it (quantize its fp32 source again)")
    else:
        assert choose_vocoder(older, "onnxruntime", cpu) == form
    trt = choose_vocoder(int8, "tensorrt", cpu)
    assert (trt.weights, trt.why) == ("fp32", "the int8 vocoder is ONNX Runtime's CPU form; tensorrt runs the fp32 one")
