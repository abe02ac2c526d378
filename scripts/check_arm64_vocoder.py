#!/usr/bin/env python3
"""The int8 vocoder and the fp32 one on ONNX Runtime's ARM64 kernels, from an x86-64 Debian host:
each ARM64 CPU that qemu-user emulates runs an aarch64 Python with the aarch64 wheels of this
environment's numpy and onnxruntime, and streams the same frames through both vocoder graphs.

    python scripts/check_arm64_vocoder.py [--qemu qemu-aarch64] [--cpus cortex-a57 cortex-a76 neoverse-n1 max]
        [--sysroot .cache/arm64]

Setup, once, into `--sysroot` (as root on Debian: the host's apt sources with arm64 added for this
download only, nothing installed on the host): the aarch64 Python 3.11 and its libraries
(`apt-get download`, unpacked with `dpkg -x`) and the aarch64 wheels (`pip download --platform`).
Then: the built-in tiny artifact's int8 twin (`quantize --vocoder int8`), 24 greedy frames of one
sentence and their PCM through the fp32 vocoder on this CPU, and per emulated CPU the int8 and
the fp32 graphs streamed in windows of 4 (tests/support/emulated.py as the child), each PCM's SNR
against this CPU's fp32 PCM; the CPU's features and 8-bit product kernel as edged/cpu.py reads
them there, and the vocoder edged/vocoder/form.py runs on it.

ONNX Runtime's MLAS picks ARM64 kernels from the auxiliary vector, which qemu sets per `-cpu`:
cortex-a57 has NEON only (the int8 products widen to 16-bit multiplies), cortex-a76 and
neoverse-n1 the dot product (as Jetson Orin's Cortex-A78AE), max the dot product, i8mm, SVE2 and
SME. It needs qemu 8 or later (it says why otherwise). Speed under an emulator means nothing; only
the PCM is checked. docs/dev/performance.md has
the figures and which qemu gave them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libffi8", "libssl3", "libexpat1", "libbz2-1.0", "liblzma5",
            "libsqlite3-0", "libuuid1", "libcrypt1", "python3.11-minimal", "libpython3.11-minimal",
            "libpython3.11-stdlib")
BOUND_DB = 20.0
"""The int8 vocoder's PCM against fp32's, at least (tests/engines/test_vocoder_int8.py's SNR_DB)."""


def setup(sysroot: Path) -> None:
    """The aarch64 Python and wheels in `sysroot` (skipped when there)."""
    if (sysroot / "usr/bin/python3.11").exists() and (sysroot / "site/onnxruntime").exists():
        return
    import numpy
    import onnxruntime

    debs, lists = sysroot / "debs", sysroot / "apt-lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    debs.mkdir(exist_ok=True)
    apt = ["apt-get", "-q", "-o", "APT::Architectures::=arm64", "-o", f"Dir::State::Lists={lists}"]
    subprocess.run([*apt, "update"], check=True)
    subprocess.run([*apt, "download", *(f"{p}:arm64" for p in PACKAGES)], cwd=debs, check=True)
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg", "-x", str(deb), str(sysroot)], check=True)
    wheels = sysroot / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "--no-deps", "--python-version",
                    "3.11", "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64", "-d",
                    str(wheels), f"numpy=={numpy.__version__}", f"onnxruntime=={onnxruntime.__version__}"], check=True)
    for wheel in wheels.glob("*.whl"):
        subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(sysroot / "site")], check=True)


def stream(qemu: str, cpu: str, sysroot: Path, graph: Path, state: list, codes: Path, work: Path) -> np.ndarray:
    """`graph`'s PCM of `codes` in windows of 4 on the emulated `cpu`."""
    out = work / "out.npz"
    command = [qemu, "-cpu", cpu, "-L", str(sysroot), str(sysroot / "usr/bin/python3.11"),
               str(ROOT / "tests/support/emulated.py"), "stream", str(graph), str(codes), str(out),
               json.dumps({"state": state, "window": 4})]
    done = subprocess.run(command, capture_output=True, text=True, env={"PYTHONPATH": str(sysroot / "site")})
    if done.returncode:
        raise SystemExit(f"{graph.name} on {cpu} failed: {done.stderr[-1500:]}")
    return np.load(out)["out"][0]


def cpu_line(qemu: str, cpu: str, sysroot: Path) -> dict:
    """edged/cpu.py's reading of the emulated CPU."""
    code = "import json; from edged.cpu import this_cpu; print(json.dumps(this_cpu().to_json()))"
    done = subprocess.run([qemu, "-cpu", cpu, "-L", str(sysroot), str(sysroot / "usr/bin/python3.11"), "-c", code],
                          capture_output=True, text=True, env={"PYTHONPATH": f"{ROOT}:{sysroot / 'site'}"}, check=True)
    return json.loads(done.stdout)


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - other)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qemu", default="qemu-aarch64")
    ap.add_argument("--cpus", nargs="+", default=["cortex-a57", "cortex-a76", "neoverse-n1", "max"])
    ap.add_argument("--sysroot", type=Path, default=ROOT / ".cache/arm64")
    args = ap.parse_args()
    setup(args.sysroot.resolve())

    from edged.artifact import BUILTIN, load_artifact
    from edged.backends import make_backend
    from edged.cpu import Cpu
    from edged.request import Sampling, SpeechRequest
    from edged.synth import Synthesizer
    from edged.vocoder.form import choose_vocoder
    from engines.quantize import quantize_artifact

    version = subprocess.run([args.qemu, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    if int(version.split("version ")[1].split(".")[0]) < 8:
        raise SystemExit(f"{version}: qemu before 8 shows the host's /proc/cpuinfo to the guest, where ONNX Runtime's "
                         "CPU probe crashes, and 7.2's -cpu max (SME on) gave wrong int8 products where 10.0 gives "
                         "the exact ones: pass --qemu a qemu-aarch64 of 8 or later (Debian 13's qemu-user)")
    print(f"command: python {' '.join(sys.argv)}\n{version}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        quantize_artifact(Path(BUILTIN), work / "int8", None, vocoder="int8")
        artifact = load_artifact(work / "int8")
        request = SpeechRequest("v", "Hello there, how are you today?", voice="vivian", sampling=Sampling.greedy(),
                                max_frames=24)
        here = Synthesizer(load_artifact(BUILTIN), make_backend("onnxruntime", 1)).synthesize([request])[0]
        np.savez(work / "codes.npz", codes=here.frames.T[None].astype(np.int64))
        print("| qemu -cpu | features (edged/cpu.py there) | int8 products | vocoder that runs | int8 graph SNR dB | "
              "fp32 graph SNR dB |\n|---|---|---|---|---|---|")
        failed = []
        for cpu in args.cpus:
            seen = cpu_line(args.qemu, cpu, args.sysroot)
            form = choose_vocoder(artifact, "onnxruntime", Cpu(seen["model"], seen["arch"], tuple(seen["features"]),
                                                                 seen["int8_products"]))
            snrs = []
            for role in ("vocoder_int8", "vocoder"):
                state = [(s.input, s.output, s.shape) for s in artifact.graphs[role].state]
                pcm = stream(args.qemu, cpu, args.sysroot, artifact.file(role), state, work / "codes.npz", work)
                snrs.append(snr_db(here.pcm[:pcm.shape[0]], pcm))
            print(f"| {cpu} | {' '.join(seen['features'])} | {seen['int8_products']} | {form.weights} | "
                  f"{snrs[0]:.1f} | {snrs[1]:.1f} |", flush=True)
            if form.weights == "int8" and snrs[0] < BOUND_DB:
                failed.append(cpu)
    if failed:
        raise SystemExit(f"the int8 vocoder runs below {BOUND_DB} dB on: {', '.join(failed)}")


if __name__ == "__main__":
    main()
