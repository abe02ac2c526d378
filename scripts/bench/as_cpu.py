#!/usr/bin/env python3
"""Run a command with ONNX Runtime's kernels of an older x86 class, natively, on a newer x86 CPU.

    python scripts/bench/as_cpu.py avx2 -- python scripts/bench/frame.py --weights int4
    python scripts/bench/as_cpu.py avx512 -- edged bench --artifact ART --batch 1

ONNX Runtime's kernel library (MLAS) chooses its code from CPUID at load, and so does edged/cpu.py
(every benchmark's `cpu:` line). Under this runner the command's CPUID reports the class's features
only: `cpuid_mask.c`, built here with the system's C compiler and preloaded, turns on CPUID faulting
(Linux arch_prctl ARCH_SET_CPUID; the CPU flag `cpuid_fault`, on Intel CPUs since Ivy Bridge and in
KVM guests) and answers each CPUID with the class's missing features cleared. The command then runs
the class's kernels at this CPU's clock, caches and memory: it shows what the kernels cost, side by
side with this CPU's own, not what a CPU of that class would take (its memory and clocks differ).
It keeps this CPU's vendor, so libraries that choose by vendor (MKL's and OpenBLAS's AMD paths,
under torch and numpy) still take this vendor's. It does not answer as another vendor: the cache and
topology leaves would stay this vendor's, and libraries reading them as the other's compute wrong
(torch's CPU decode of the tiny codec did, tried once).
qemu-user (tests/support/emulated.py) reports the same features but emulates every instruction.
The command's own SIGSEGV handler (Python's faulthandler: pytest, `edged serve`) still gets every
fault that is not a CPUID, so whole suites and the daemon run under it:

    python scripts/bench/as_cpu.py avx2 -- .venv/bin/python -m pytest -q tests/engines

Classes (each a set of features cleared; the rest of this CPU's stay):

- `avx2`: AVX2 and FMA, no AVX-512, no VNNI, no AMX (AMD Zen 2 / 3, Intel Haswell to Skylake client);
- `avx512`: AVX-512 without VNNI, AMX or AVX-512 BF16 (Intel Skylake server);
- `avx512-vnni`: AVX-512 VNNI without AMX or AVX-VNNI (Intel Ice Lake server, AMD Zen 4).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE = HERE / "cpuid_mask.c"

AVX512 = {"7.0.ebx": 0xDC230000,  # AVX512 F DQ IFMA PF ER CD BW VL
          "7.0.ecx": 0x5842,  # AVX512 VBMI VBMI2 VNNI BITALG VPOPCNTDQ
          "7.0.edx": 0x3C0010C,  # AVX512 4VNNIW 4FMAPS VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8
          "7.1.eax": 0x800030,  # AVX-VNNI, AVX512-BF16, AVX-IFMA
          "7.1.edx": 0x80430}  # AVX-VNNI-INT8, AVX-NE-CONVERT, AVX-VNNI-INT16, AVX10
VNNI = {"7.0.ecx": 0x800,  # AVX512-VNNI
        "7.0.edx": 0x3C0010C,  # as above: the 4-operand forms, AMX, FP16
        "7.1.eax": 0x800030,
        "7.1.edx": 0x80430}
AMX = {"7.0.edx": 0x3400000,  # AMX-BF16, AMX-TILE, AMX-INT8
       "7.1.eax": 0x10,  # AVX-VNNI
       "7.1.edx": 0x80430}
CLASSES = {"avx2": AVX512, "avx512": VNNI, "avx512-vnni": AMX}
"""Class -> the CPUID bits cleared ("LEAF.SUBLEAF.REG" -> mask), from Intel's SDM vol. 2A, CPUID leaf 07H."""


def clear_spec(cls: str) -> str:
    return ";".join(f"{where}={bits:#x}" for where, bits in CLASSES[cls].items())


def library() -> Path:
    """cpuid_mask.c built once per source text, under build/."""
    source = SOURCE.read_bytes()
    out = ROOT / "build" / "cpuid-mask" / f"cpuid_mask-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not out.exists():
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if compiler is None:
            sys.exit("as_cpu: no C compiler (cc or gcc) to build cpuid_mask.c")
        out.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run([compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out), str(SOURCE)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"as_cpu: building {SOURCE.name} failed:\n{built.stderr}")
    return out


def environment(cls: str) -> dict[str, str]:
    """This process's environment with the mask preloaded for `cls`."""
    env = dict(os.environ)
    env["EDGED_CPUID_CLEAR"] = clear_spec(cls)
    env["LD_PRELOAD"] = " ".join(x for x in (str(library()), env.get("LD_PRELOAD", "")) if x)
    env["QEMU_UNSET_ENV"] = "LD_PRELOAD"  # qemu-x86_64 emulates its guest's CPUID: the mask is the host's only
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cls", choices=sorted(CLASSES), help="the x86 class whose kernels the command runs")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command: as_cpu.py CLASS -- COMMAND [ARGS...]")
    sys.path.insert(0, str(ROOT))
    from edged.cpu import this_cpu

    print(f"as_cpu: the {args.cls} class's kernels on {this_cpu().line()}", flush=True)
    code = subprocess.run(command, env=environment(args.cls)).returncode
    if code < 0:  # killed by a signal: die of the same one, so the caller sees what the command did
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
