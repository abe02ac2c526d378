#!/usr/bin/env python3
"""The int8 vocoder and the fp32 one on ONNX Runtime's ARM64 kernels, from an x86-64 Debian host:
each ARM64 CPU that qemu-user emulates runs an aarch64 Python with the aarch64 wheels of this
environment's numpy and onnxruntime, and streams the same frames through both vocoder graphs.

    python scripts/check_arm64_vocoder.py [--qemu qemu-aarch64] [--cpus CPU ...] [--sysroot .cache/arm64]

Setup, once, into `--sysroot` (nothing is installed on the host): the aarch64 Python 3.11 and its
libraries from Debian 12's archive, through the host's apt sources (so a Debian 12 host: `apt-get
download` with arm64 added for that download only, unpacked with `dpkg -x`), and the aarch64 wheels
(`pip download --platform`). Then: the built-in tiny
artifact's int8 twin (`quantize --vocoder int8`), 24 greedy frames of one sentence and their PCM
through the fp32 vocoder on this CPU, and per emulated CPU the int8 and the fp32 graphs streamed in
windows of 4 (tests/support/emulated.py as the child), each PCM's SNR against this CPU's fp32 PCM;
the CPU's features and 8-bit product kernel as edged/cpu.py reads them there, and the vocoder
edged/vocoder/form.py runs on it. It exits 1 when a vocoder that would run misses its bound.

ONNX Runtime's MLAS picks ARM64 kernels from the auxiliary vector, which qemu sets per `-cpu`:
cortex-a57 has NEON only (the int8 products widen to 16-bit multiplies), cortex-a76 and
neoverse-n1 the dot product (as Jetson Orin's Cortex-A78AE), max the dot product, i8mm, SVE2 and
(from qemu 7.1) SME. qemu before 8 shows the guest the host's /proc/cpuinfo, where ONNX Runtime's
CPU probe crashes: with such a qemu each guest runs in a mount namespace of its own over an ARM64
/proc/cpuinfo of that CPU (root: unshare and mount), and `max` runs with SME off, since qemu 7.2's
SME gave wrong int8 products where qemu 10.0's gives the exact ones (docs/dev/performance.md).
Speed under an emulator means nothing; only the PCM is checked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libffi8", "libssl3", "libexpat1", "libbz2-1.0", "liblzma5",
            "libsqlite3-0", "libuuid1", "libcrypt1", "python3.11-minimal", "libpython3.11-minimal",
            "libpython3.11-stdlib")
BOUND_DB = 20.0
"""The int8 vocoder's PCM against fp32's, at least (tests/support/emulated.py's SNR_DB)."""
FP32_BOUND_DB = 40.0
"""The fp32 vocoder's PCM on another CPU's kernels against this one's, at least
(tests/engines/test_vocoder_int8.py's FP32_SNR_DB)."""
CPUINFO = {  # what Linux shows in /proc/cpuinfo on each: MIDR variant and part, and the Features line
    "cortex-a57": ("0x1", "0xd07", "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a76": ("0x4", "0xd0b", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                                   "lrcpc dcpop asimddp"),
    "neoverse-n1": ("0x3", "0xd0c", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                                    "lrcpc dcpop asimddp ssbs"),
    "max": ("0x1", "0xd40", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
                            "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm ilrcpc flagm sb paca pacg dcpodp sve2 "
                            "sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 "
                            "i8mm bf16 rng bti"),
}


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
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps",
                    "--python-version", "3.11", "--platform", "manylinux_2_28_aarch64", "--platform",
                    "manylinux2014_aarch64", "-d", str(wheels), f"numpy=={numpy.__version__}",
                    f"onnxruntime=={onnxruntime.__version__}"], check=True)
    for wheel in wheels.glob("*.whl"):
        subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(sysroot / "site")], check=True)


def qemu_major(qemu: str) -> tuple[int, str]:
    version = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return int(version.split("version ")[1].split(".")[0]), version


@dataclass
class Guest:
    """An aarch64 Python on one emulated CPU."""

    qemu: str
    cpu: str
    sysroot: Path
    work: Path

    def run(self, args: list[str], pythonpath: str) -> subprocess.CompletedProcess:
        command = [self.qemu, "-cpu", self.cpu, "-L", str(self.sysroot), str(self.sysroot / "usr/bin/python3.11"), *args]
        if qemu_major(self.qemu)[0] < 8:  # the host's /proc/cpuinfo would show through (module docstring)
            model = self.cpu.split(",")[0]
            variant, part, features = CPUINFO[model]
            cpuinfo = self.work / f"cpuinfo-{model}"
            cpuinfo.write_text("".join(f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: "
                                       f"0x41\nCPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\n"
                                       "CPU revision\t: 1\n\n" for i in range(2)))
            command = ["unshare", "-m", "sh", "-c", f'mount --bind {cpuinfo} /proc/cpuinfo && exec "$@"', "guest",
                       *command]
        return subprocess.run(command, capture_output=True, text=True, env={"PYTHONPATH": pythonpath})

    def stream(self, graph: Path, state: list, codes: Path) -> np.ndarray:
        """`graph`'s PCM of `codes` in windows of 4."""
        out = self.work / "out.npz"
        done = self.run([str(ROOT / "tests/support/emulated.py"), "stream", str(graph), str(codes), str(out),
                         json.dumps({"state": state, "window": 4})], str(self.sysroot / "site"))
        if done.returncode:
            raise RuntimeError(f"{graph.name} on {self.cpu} failed: {done.stderr[-1500:]}")
        return np.load(out)["out"][0]

    def cpu_json(self) -> dict:
        """edged/cpu.py's reading of the emulated CPU (status.cpu)."""
        code = "import json; from edged.cpu import this_cpu; print(json.dumps(this_cpu().to_json()))"
        done = self.run(["-c", code], f"{ROOT}:{self.sysroot / 'site'}")
        if done.returncode:
            raise RuntimeError(f"edged/cpu.py on {self.cpu} failed: {done.stderr[-1500:]}")
        return json.loads(done.stdout)


@dataclass
class Row:
    cpu: str
    seen: dict
    vocoder: str
    int8_db: float
    fp32_db: float

    def line(self) -> str:
        return (f"| {self.cpu} | {' '.join(self.seen['features'])} | {self.seen['int8_products']} | {self.vocoder} | "
                f"{self.int8_db:.1f} | {self.fp32_db:.1f} |")

    def problem(self) -> str | None:
        if self.vocoder == "int8" and self.int8_db < BOUND_DB:
            return f"{self.cpu}: the int8 vocoder runs there at {self.int8_db:.1f} dB (bound {BOUND_DB})"
        if self.fp32_db < FP32_BOUND_DB:
            return f"{self.cpu}: the fp32 vocoder at {self.fp32_db:.1f} dB (bound {FP32_BOUND_DB})"
        return None


def default_cpus(qemu: str) -> list[str]:
    return ["cortex-a57", "cortex-a76", "neoverse-n1", "max" if qemu_major(qemu)[0] >= 8 else "max,sme=off"]


def check(qemu: str, cpus: list[str], sysroot: Path, int8_artifact: Path, work: Path) -> list[Row]:
    """Per emulated CPU: what edged/cpu.py reads there, the vocoder that runs, and both graphs' SNR."""
    from edged.artifact import BUILTIN, load_artifact
    from edged.backends import make_backend
    from edged.cpu import Cpu
    from edged.request import Sampling, SpeechRequest
    from edged.synth import Synthesizer
    from edged.vocoder.form import choose_vocoder

    artifact = load_artifact(int8_artifact)
    request = SpeechRequest("v", "Hello there, how are you today?", voice="vivian", sampling=Sampling.greedy(),
                            max_frames=24)
    here = Synthesizer(load_artifact(BUILTIN), make_backend("onnxruntime", 1)).synthesize([request])[0]
    codes = work / "codes.npz"
    np.savez(codes, codes=here.frames.T[None].astype(np.int64))
    rows = []
    for cpu in cpus:
        guest = Guest(qemu, cpu, sysroot, work)
        seen = guest.cpu_json()
        form = choose_vocoder(artifact, "onnxruntime", Cpu(seen["model"], seen["arch"], tuple(seen["features"]),
                                                           seen["int8_products"]))
        snrs = []
        for role in ("vocoder_int8", "vocoder"):
            state = [(s.input, s.output, s.shape) for s in artifact.graphs[role].state]
            pcm = guest.stream(artifact.file(role), state, codes)
            snrs.append(float(20 * np.log10(np.linalg.norm(here.pcm[:pcm.shape[0]])
                                            / np.linalg.norm(here.pcm[:pcm.shape[0]] - pcm))))
        rows.append(Row(cpu, seen, form.weights, *snrs))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qemu", default="qemu-aarch64")
    ap.add_argument("--cpus", nargs="+", default=None, help="qemu -cpu models (default: cortex-a57 cortex-a76 "
                                                            "neoverse-n1 max, max,sme=off before qemu 8)")
    ap.add_argument("--sysroot", type=Path, default=ROOT / ".cache/arm64")
    args = ap.parse_args()
    setup(args.sysroot.resolve())
    from edged.artifact import BUILTIN
    from engines.quantize import quantize_artifact

    print(f"command: python {' '.join(sys.argv)}\n{qemu_major(args.qemu)[1]}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        quantize_artifact(Path(BUILTIN), work / "int8", None, vocoder="int8")
        rows = check(args.qemu, args.cpus or default_cpus(args.qemu), args.sysroot.resolve(), work / "int8", work)
    print("| qemu -cpu | features (edged/cpu.py there) | int8 products | vocoder that runs | int8 graph SNR dB | "
          "fp32 graph SNR dB |\n|---|---|---|---|---|---|")
    print("\n".join(row.line() for row in rows))
    problems = [p for p in (row.problem() for row in rows) if p]
    if problems:
        raise SystemExit("\n".join(problems))


if __name__ == "__main__":
    main()
