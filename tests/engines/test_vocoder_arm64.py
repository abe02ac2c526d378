"""The int8 vocoder on ONNX Runtime's ARM64 kernels (a Jetson's CPU is ARM64), from an x86-64 Debian
machine: scripts/check_arm64_vocoder.py runs an aarch64 Python with this environment's numpy and
onnxruntime under qemu-aarch64, one emulated CPU per kernel class, and streams the same frames
through the int8 and the fp32 vocoder graphs (docs/dev/performance.md, "The int8 vocoder on ARM64's
kernels"). The first run downloads the aarch64 Python and wheels into .cache/arm64."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

import pytest

from engines.quantize import quantize_artifact

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_arm64_vocoder as arm64

EXPECTED = {"cortex-a57": ("neon", "fp32"), "cortex-a76": ("neon-dot", "int8"), "neoverse-n1": ("neon-dot", "int8"),
            "max": ("neon-i8mm", "int8"), "max,sme=off": ("neon-i8mm", "int8")}
"""Per emulated CPU: the 8-bit product kernel edged/cpu.py reads there, and the vocoder that runs
(docs/artifact.md's table)."""


def _why_not() -> str | None:
    if platform.machine() != "x86_64" or shutil.which("qemu-aarch64") is None:
        return "needs qemu-aarch64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)"
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    if (release.get("ID"), release.get("VERSION_ID", "").strip('"')) != ("debian", "12"):
        return "needs Debian 12's archive, which serves the aarch64 Python 3.11 (scripts/check_arm64_vocoder.py)"
    if arm64.qemu_major("qemu-aarch64")[0] < 8 and os.geteuid() != 0:
        return "qemu before 8 needs root here: each guest gets an ARM64 /proc/cpuinfo in a mount namespace"
    return None


def test_the_int8_vocoder_meets_its_bound_on_every_arm64_kernel_and_runs_where_the_dot_product_is(
        builtin_artifact, tmp_path):
    """NEON alone (cortex-a57), the dot product (cortex-a76 and neoverse-n1, as Orin's Cortex-A78AE),
    i8mm and SVE (max): the int8 graph's PCM within the bound on each, the fp32 graph's 40 dB above
    its difference from this CPU's; edged/cpu.py reads each CPU's kernel and the int8 vocoder runs
    where the dot product is, fp32 where it is not (no faster there)."""
    why = _why_not()
    if why:
        pytest.skip(why)
    sysroot = ROOT / ".cache/arm64"
    arm64.setup(sysroot)
    quantize_artifact(builtin_artifact, tmp_path / "int8", None, vocoder="int8")
    cpus = arm64.default_cpus("qemu-aarch64")
    rows = arm64.check("qemu-aarch64", cpus, sysroot, tmp_path / "int8", tmp_path)
    print("\n".join(row.line() for row in rows))
    assert [(row.seen["arch"], row.seen["int8_products"], row.vocoder) for row in rows] == \
        [("aarch64", *EXPECTED[cpu]) for cpu in cpus]
    assert [row.problem() for row in rows] == [None] * len(rows)
    assert all(row.int8_db >= arm64.BOUND_DB for row in rows), [row.line() for row in rows]
