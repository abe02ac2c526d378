#!/usr/bin/env python3
"""The device acceptance run of the TensorRT backend: one command on a Jetson, one summary table.

    scripts/validate_jetson.sh [--artifact DIR] [--soak-requests N] [--fp16] [--weights int4] [--clocks]
    python scripts/validate_jetson.py --backend onnxruntime     # the same run on ONNX Runtime (CPU): a dry run

In order, each a row of the summary (PASS / FAIL / SKIP and what was measured):
1. environment: TensorRT, CUDA device, jetson_clocks (`--clocks` runs `sudo jetson_clocks` first);
   the CPU as ONNX Runtime's kernels see it (edged/cpu.py: on an Orin it must report the dot product,
   whose 8-bit products are exact, so an int8 vocoder on ONNX Runtime would run there);
   then the backend's CUDA side alone (`scripts/validate_cuda.py`'s rows: kernels built and run,
   the K/V append, copies, CUDA graphs, a failed capture);
2. plans: `edged-engines plans` for a copy of the artifact (fp32, TF32 off);
3. backend tests on this backend: conformance, alignment, batched == alone, no allocation on the step
   path, streamed vocoder == whole (pytest with EDGED_TEST_BACKEND / EDGED_TEST_ARTIFACT);
4. fp32 parity with ONNX Runtime: greedy frames agreement, PCM max error and SNR; the clone encoder
   (voice cloning, on ONNX Runtime on the CPU whatever the backend): the time a 1, 10 and 30 s
   reference takes; then the same cohort with CUDA graphs and with per-run enqueues: equal frames,
   milliseconds per frame of each, and the graphs' frames again after other plans re-bound the
   shared contexts (each captured graph has a context of its own); activation memory: the one block
   every execution context shares, against what kSTATIC contexts would claim each; launches per
   step: what the host puts on the stream for one talker step of a cohort of max_batch (the K/V
   appends ride inside the steps' graphs);
5. `--fp16`: the artifact's fp16 twin (`edged-engines fp16`: fp16 weights, fp32 norms, softmax,
   heads and sampling; needs the `onnx` package), built strongly typed, against ONNX Runtime fp32:
   frames agreement and PCM SNR; `--weights int4`: the artifact's int4 twin in the Jetson form
   (`edged-engines quantize --target jetson`: the fp16 network, fp16 activations and KV cache, whose
   matrix weights are INT4 in 128-row blocks with fp16 scales), built strongly typed (TensorRT's
   INT4-weight fp16 GEMMs): against the same twin on ONNX Runtime (frames agreement and PCM SNR; at
   least 90 % of frames equal), and fp16+int4 against ONNX Runtime fp32 (greedy frames agreement and
   PCM SNR, beside the same form's on ONNX Runtime: int4 on random weights moves most decisions, and
   one flipped near-tie changes every later frame of its request, so the check is that TensorRT's
   agreement is within 10 % of the frames of ONNX Runtime's) (int8 has no form TensorRT 10.3 builds:
   engines/weight_form.py);
6. soak: the daemon on this backend, 4 clients at once, N requests each: every one done, time to first
   audio (p50/p95), RTF, per-stage milliseconds per frame, peak memory (tegrastats when present);
   boot time: the daemon's own (its log: plans loaded, buffers claimed, CUDA graphs captured, warm-up)
   against the unit's TimeoutStartSec, and the graphs it captured;
7. SIGTERM: the daemon drains, closes the backend (the CUDA context is popped) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import validate_cuda
from summary import Summary

from edged.artifact import BUILTIN, load_artifact
from edged.backends import make_backend
from edged.core import Core
from edged.cpu import DOT, this_cpu
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

TEXTS = ["Validating the TensorRT backend on this device.", "The quick brown fox jumps over the lazy dog.",
         "你好，这是一个测试。", "A fourth sentence, so that the cohort is full."]
BACKEND_TESTS = ["tests/backends/test_conformance.py", "tests/backends/test_alignment.py", "tests/test_batch.py",
                 "tests/test_no_alloc.py", "tests/test_vocoder_stream.py"]


def environment(backend: str, clocks: bool, summary: Summary) -> None:
    if clocks and shutil.which("jetson_clocks"):
        subprocess.run(["sudo", "jetson_clocks"], check=False)
    shown = subprocess.run(["jetson_clocks", "--show"], capture_output=True, text=True) \
        if shutil.which("jetson_clocks") else None
    clock_state = "jetson_clocks: " + ("set" if clocks else "as found") if shown is not None else "not a Jetson"
    cpu = this_cpu()
    # Orin's Cortex-A78AE has the dot product: ONNX Runtime's 8-bit products there are exact (edged/cpu.py)
    summary.add("cpu", cpu.int8_products in DOT if cpu.arch == "aarch64" else None,
                f"{cpu.line()}; an int8 vocoder would run as {'int8' if cpu.int8_products in DOT else 'fp32'} on "
                f"ONNX Runtime")
    if backend != "tensorrt":
        summary.add("environment", None, f"backend {backend} (dry run); {clock_state}")
        return
    import pycuda.driver as cuda
    import tensorrt

    cuda.init()
    summary.add("environment", True, f"TensorRT {tensorrt.__version__}, {cuda.Device(0).name()}; {clock_state}")


def plans(artifact: Path, backend: str, summary: Summary, label: str) -> bool:
    if backend != "tensorrt":
        summary.add(label, None, "not needed on " + backend)
        return True
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "engines.cli", "plans", str(artifact)], capture_output=True, text=True)
    summary.add(label, done.returncode == 0,
                f"{time.perf_counter() - t0:.0f} s" if done.returncode == 0 else done.stderr.strip()[-300:])
    return done.returncode == 0


def backend_tests(artifact: Path, backend: str, summary: Summary) -> None:
    env = {**os.environ, "EDGED_TEST_BACKEND": backend, "EDGED_TEST_ARTIFACT": str(artifact)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BACKEND_TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    summary.add("backend tests", done.returncode == 0, last)


def synthesize(artifact: Path, backend_name: str, cuda_graphs: bool = True) -> list:
    backend = make_backend(backend_name, cuda_graphs=cuda_graphs)
    try:
        requests = [SpeechRequest(f"r{i}", t, sampling=Sampling.greedy(), max_frames=60) for i, t in enumerate(TEXTS)]
        return Synthesizer(load_artifact(artifact), backend).synthesize(requests)
    finally:
        backend.close()


def clone_encoder(artifact: Path, summary: Summary) -> None:
    """The clone encoder (voice cloning), which runs on ONNX Runtime on the CPU whatever the daemon's
    backend (TensorRT gets no plan for it): references of 1, 10 and 30 s, the time each takes here."""
    from edged.clone import VoiceEncoder, can_clone

    if not can_clone(load_artifact(artifact).graphs):
        summary.add("clone encoder", None, "the artifact has none")
        return
    backend = make_backend("onnxruntime")
    runs = []
    try:
        encoder = VoiceEncoder(load_artifact(artifact), backend)
        encoder.preallocate()
        for seconds in (1, 10, 30):
            t = np.arange(seconds * 24000) / 24000
            pcm = (0.3 * np.sin(2 * np.pi * 150 * t) * np.sin(2 * np.pi * 2 * t)).astype(np.float32)
            t0 = time.perf_counter()
            voice = encoder.encode(pcm, "the reference")
            runs.append((voice, time.perf_counter() - t0))
    finally:
        backend.close()
    finite = all(np.isfinite(v.xvector).all() and v.ref_codes is not None and len(v.ref_codes) for v, _ in runs)
    took = ", ".join(f"{s} s: {t * 1e3:.0f} ms" for s, (_, t) in zip((1, 10, 30), runs))
    summary.add("clone encoder", finite, f"on ONNX Runtime (CPU): encode {took}")


def parity(artifact: Path, backend: str, summary: Summary, label: str, reference: list | None = None) -> list:
    got = synthesize(artifact, backend)
    reference = reference or synthesize(artifact, "onnxruntime")
    frames = sum(min(len(a.frames), len(b.frames)) for a, b in zip(reference, got))
    same = sum(int(np.sum(np.all(a.frames[:len(b.frames)] == b.frames[:len(a.frames)], axis=1)))
               for a, b in zip(reference, got))
    errors = [np.abs(a.pcm[:len(b.pcm)] - b.pcm[:len(a.pcm)]).max() for a, b in zip(reference, got)]
    snr = min(10 * np.log10(np.sum(a.pcm ** 2) / max(np.sum((a.pcm[:len(b.pcm)] - b.pcm[:len(a.pcm)]) ** 2), 1e-30))
              for a, b in zip(reference, got))
    exact = label.startswith("fp32")
    ok = same == frames and max(errors) < 1e-3 if exact else same / frames > 0.9
    summary.add(label, ok, f"frames equal {same}/{frames}; PCM max error {max(errors):.1e}, SNR >= {snr:.1f} dB")
    return reference


def jetson_weights(source: Path, twin: Path, weights: str, backend: str, summary: Summary, reference: list) -> None:
    """The `--weights int4` rows: the Jetson form (an fp16 network with INT4 weights) made from the fp32
    artifact, its plans, its frames on this backend against the same form on ONNX Runtime, and
    against ONNX Runtime fp32 (`reference`)."""
    made = subprocess.run([sys.executable, "-m", "engines.cli", "quantize", "--artifact", str(source),
                           "--out", str(twin), "--weights", weights, "--target", "jetson"], capture_output=True, text=True)
    if made.returncode:
        summary.add(f"{weights} artifact", False, made.stderr.strip()[-300:])
    elif plans(twin, backend, summary, f"plans (fp16 + {weights}, strongly typed)"):
        here = parity(twin, backend, summary, f"fp16 + {weights} vs the same artifact on ONNX Runtime")
        same, frames, snr = agreement(reference, synthesize(twin, backend))
        cpu_same, _, cpu_snr = agreement(reference, here)
        summary.add(f"fp16 + {weights} vs ONNX Runtime fp32", abs(same - cpu_same) <= 0.1 * frames,
                    f"greedy frames equal {same}/{frames}, PCM SNR >= {snr:.1f} dB (the same form on ONNX Runtime: "
                    f"{cpu_same}/{frames}, {cpu_snr:.1f} dB)")


def agreement(reference: list, got: list) -> tuple[int, int, float]:
    """(frames equal at the same index, frames compared, the worst request's PCM SNR in dB)."""
    frames = sum(min(len(a.frames), len(b.frames)) for a, b in zip(reference, got))
    same = sum(int(np.sum(np.all(a.frames[:len(b.frames)] == b.frames[:len(a.frames)], axis=1)))
               for a, b in zip(reference, got))
    snr = min(10 * np.log10(np.sum(a.pcm ** 2) / max(np.sum((a.pcm[:len(b.pcm)] - b.pcm[:len(a.pcm)]) ** 2), 1e-30))
              for a, b in zip(reference, got))
    return same, frames, snr


def cuda_graphs(artifact: Path, backend: str, summary: Summary) -> None:
    """The same greedy cohort with step plans replayed as CUDA graphs and enqueued per run: equal frames,
    and each one's talker and vocoder milliseconds per frame (from the step reports), side by side. Then,
    on the backend with graphs, requests with a speculative verify window the boot did not capture (its
    passes bound and enqueued on the code predictor's shared context, prefills on the talker's), and the
    cohort once more: its replayed graphs still equal the per-run enqueues after other plans re-bound
    the contexts (each captured graph has its own)."""
    if backend != "tensorrt":
        summary.add("CUDA graphs", None, "TensorRT only")
        return

    def cohort() -> list[SpeechRequest]:
        return [SpeechRequest(f"r{i}", t, sampling=Sampling.greedy(), max_frames=60) for i, t in enumerate(TEXTS)]

    runs, rebound = {}, []
    for graphs in (True, False):
        engines = make_backend(backend, cuda_graphs=graphs)
        try:
            synth = Synthesizer(load_artifact(artifact), engines)
            runs[graphs] = synth.synthesize(cohort())
            if graphs:
                synth.synthesize([SpeechRequest(f"v{i}", t, sampling=Sampling(seed=i, cp_spec_verify_size=2),
                                                max_frames=20) for i, t in enumerate(TEXTS)])
                rebound = synth.synthesize(cohort())
        finally:
            engines.close()
    same = all(np.array_equal(a.frames, b.frames) for a, b in zip(runs[True], runs[False]))
    still = all(np.array_equal(a.frames, b.frames) for a, b in zip(rebound, runs[False]))
    per_frame = {graphs: stage_ms(results) for graphs, results in runs.items()}
    (talker_g, vocoder_g), (talker_e, vocoder_e) = per_frame[True], per_frame[False]
    summary.add("CUDA graphs", same and still,
                f"frames equal: {same}; after other plans re-bound the contexts: {still}; per frame with graphs: "
                f"talker {talker_g:.1f} ms, vocoder {vocoder_g:.1f} ms; enqueued: talker {talker_e:.1f} ms, vocoder "
                f"{vocoder_e:.1f} ms ({(talker_e + vocoder_e) / (talker_g + vocoder_g):.2f}x)")


def activation_memory(artifact: Path, backend_name: str, summary: Summary) -> None:
    """The activation block every execution context shares (USER_MANAGED: one per captured graph, one
    per profile for the plans enqueued), against the sum kSTATIC contexts would claim (each its
    engine's size)."""
    if backend_name != "tensorrt":
        summary.add("activation memory", None, "TensorRT only")
        return
    backend = make_backend(backend_name)
    try:
        Synthesizer(load_artifact(artifact), backend)
        contexts = sum(len(e.contexts()) for e in backend.engines)
        static = sum(e.activation_bytes * len(e.contexts()) for e in backend.engines)
        shared = backend.activation_bytes()
        summary.add("activation memory", shared == max(e.activation_bytes for e in backend.engines) and shared < static,
                    f"one block of {shared / 2**20:.1f} MiB for {contexts} contexts (kSTATIC: {static / 2**20:.1f} MiB)")
    finally:
        backend.close()


def launches_per_step(artifact: Path, backend_name: str, summary: Summary, steps: int = 8) -> None:
    """What the host puts on the stream for one talker step of a full cohort: the decode and the code
    predictor's passes, one graph launch each (engine + K/V append when enqueued); never a copy per layer."""
    if backend_name != "tensorrt":
        summary.add("launches per step", None, "TensorRT only (ONNX Runtime launches nothing on a device)")
        return
    backend = make_backend(backend_name)
    try:
        a = load_artifact(artifact)
        core = Core(a, backend)
        core.preallocate()
        members = [core.prepare(SpeechRequest(f"l{i}", TEXTS[i % len(TEXTS)], sampling=Sampling.greedy()), i)
                   for i in range(a.max_batch)]
        before = backend.launches
        for _ in range(steps):
            core.talker.step_cohort(members)
        per_step = (backend.launches - before) / steps
        plans = 1 + a.dims.code_groups - 1  # the decode and one pass per residual group
        summary.add("launches per step", per_step <= 2 * plans,
                    f"{per_step:.1f} at batch {a.max_batch} ({plans} plans; {backend.graphs()} CUDA graphs; "
                    f"{2 * a.dims.layers * a.max_batch} K/V copies before)")
    finally:
        backend.close()


def stage_ms(reports: list) -> tuple[float, float]:
    """Talker and vocoder milliseconds per frame over `reports` (dicts, or results carrying `.report`)."""
    reports = [getattr(r, "report", r) for r in reports]
    frames = max(sum(r["frames"] for r in reports), 1)
    return (sum(r["stages"][0]["step_ms"] for r in reports) / frames,
            sum(r["stages"][1]["vocoder_ms"] for r in reports) / frames)


def soak(artifact: Path, backend: str, requests: int, summary: Summary) -> None:
    from edged.client import Client

    tmp = Path(tempfile.mkdtemp(prefix="edged-validate-"))
    endpoint = f"ipc://{tmp / 'edged.sock'}"
    (tmp / "edged.toml").write_text(f'[daemon]\nbackend = "{backend}"\nartifact = "{artifact}"\n'
                                    '[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n'
                                    '[sampling]\ntemperature = 0.0\ncp_temperature = 0.0\n')
    log = open(tmp / "daemon.log", "w")
    daemon = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(tmp / "edged.toml"),
                               "--listen", endpoint], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "XDG_STATE_HOME": str(tmp)})
    memory = Tegrastats()
    reports: list[dict] = []
    failures: list[str] = []
    try:
        wait_ready(endpoint, daemon, tmp)
        memory.start()

        def client(i: int) -> None:
            with Client(endpoint, timeout_s=300) as c:
                for k in range(requests):
                    done = c.speak(TEXTS[(i + k) % len(TEXTS)], play=False, stream=True, max_audio_ms=4000).wait()
                    (reports if done.reason in ("eos", "length") else failures).append(done.report)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        memory.stop()
        ttfa = sorted(r["first_audio_ms"] for r in reports)
        talker, vocoder = stage_ms(reports)
        prefill = statistics.median(r["stages"][0]["prefill_ms"] for r in reports) if reports else 0
        summary.add("soak", not failures and len(reports) == 4 * requests,
                    f"{len(reports)}/{4 * requests} done in {wall:.1f} s; TTFA p50 {pct(ttfa, 50):.0f} ms, p95 "
                    f"{pct(ttfa, 95):.0f} ms; RTF p50 {statistics.median(r['rtf'] for r in reports):.3f}; per frame: "
                    f"talker {talker:.1f} ms, vocoder {vocoder:.1f} ms; prefill p50 {prefill:.0f} ms; "
                    f"{memory.describe()}")
        boot_time((tmp / "daemon.log").read_text(), summary)
        daemon.send_signal(15)
        code = daemon.wait(timeout=60)
        closed = f"closed the {backend} backend" in (tmp / "daemon.log").read_text()
        summary.add("SIGTERM", code == 0 and closed, f"exit code {code}; backend closed: {closed}")
    finally:
        if daemon.poll() is None:
            daemon.kill()
        log.close()


def boot_time(log: str, summary: Summary) -> None:
    """The daemon's boot (its "serving" line) against the unit's TimeoutStartSec: PASS within half of it.
    With the artifact's plans at hand, also what reading them costs at microSD (40-90 MB/s) and NVMe
    (1-2 GB/s) rates: the boot reads each plan once and no weights (plan_file.py checks sizes and times)."""
    served = re.search(r"\(artifact (.+), max_batch \d+, (\d+) CUDA graphs, boot ([\d.]+) s\)", log)
    unit = re.search(r"^TimeoutStartSec=(\d+)s", (ROOT / "systemd" / "edged.service").read_text(), re.M)
    if served is None or unit is None:
        summary.add("boot time", False, "no boot line in the daemon's log" if served is None else "no TimeoutStartSec")
        return
    graphs, seconds, limit = int(served.group(2)), float(served.group(3)), int(unit.group(1))
    detail = f"{seconds:.1f} s ({graphs} CUDA graphs captured); TimeoutStartSec {limit} s"
    plans = sum(p.stat().st_size for p in Path(served.group(1)).glob("*.plan"))
    if plans:
        mb = plans / 1e6
        detail += (f"; plans {mb:.0f} MB: {mb / 90:.1f}-{mb / 40:.1f} s to read from microSD, {mb / 2000:.1f}-"
                   f"{mb / 1000:.1f} s from NVMe")
    summary.add("boot time", seconds < limit / 2, detail)


def wait_ready(endpoint: str, daemon: subprocess.Popen, tmp: Path) -> None:
    from edged.client import Client
    from edged.locate import NoDaemon

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError((tmp / "daemon.log").read_text())
        try:
            with Client(endpoint, timeout_s=1) as c:
                c.status()
            return
        except (TimeoutError, NoDaemon):  # not answering yet, or its socket not there yet
            time.sleep(0.5)
    raise RuntimeError("the daemon did not become ready")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class Tegrastats:
    """Peak RAM from `tegrastats` (Jetson), sampled while the soak runs."""

    def __init__(self) -> None:
        self.peak_mb = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if not shutil.which("tegrastats"):
            return
        self.proc = subprocess.Popen(["tegrastats", "--interval", "200"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            match = re.search(r"RAM (\d+)/(\d+)MB", line)
            if match:
                self.peak_mb = max(self.peak_mb, int(match.group(1)))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()

    def describe(self) -> str:
        return f"peak RAM {self.peak_mb} MB (tegrastats)" if self.proc is not None else "no tegrastats"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="tensorrt", choices=["tensorrt", "onnxruntime"])
    p.add_argument("--artifact", type=Path, default=BUILTIN)
    p.add_argument("--soak-requests", type=int, default=25, help="requests per client (4 clients)")
    p.add_argument("--fp16", action="store_true", help="also the artifact's fp16 twin, built strongly typed, and its quality")
    p.add_argument("--weights", nargs="*", choices=["int4"], default=[],
                   help="also the artifact's int4 twin in the Jetson form (engines/weight_form.py), built strongly "
                        "typed: plans, and frames against the same twin on ONNX Runtime")
    p.add_argument("--clocks", action="store_true", help="run `sudo jetson_clocks` first (the timings assume it)")
    args = p.parse_args()
    summary = Summary()
    work = Path(tempfile.mkdtemp(prefix="edged-validate-"))
    artifact = work / "fp32"
    shutil.copytree(args.artifact, artifact)
    environment(args.backend, args.clocks, summary)
    if args.backend == "tensorrt":
        validate_cuda.checks(summary)  # the backend's CUDA side alone first: kernels, copies, graphs
    if plans(artifact, args.backend, summary, "plans (fp32)"):
        backend_tests(artifact, args.backend, summary)
        reference = parity(artifact, args.backend, summary, "fp32 parity with ONNX Runtime")
        clone_encoder(artifact, summary)
        cuda_graphs(artifact, args.backend, summary)
        activation_memory(artifact, args.backend, summary)
        launches_per_step(artifact, args.backend, summary)
        if args.fp16:
            fp16 = work / "fp16"
            made = subprocess.run([sys.executable, "-m", "engines.cli", "fp16", "--artifact", str(args.artifact),
                                   "--out", str(fp16)], capture_output=True, text=True)
            if made.returncode:
                summary.add("fp16 artifact", False, made.stderr.strip()[-300:])
            elif plans(fp16, args.backend, summary, "plans (fp16, strongly typed)"):
                parity(fp16, args.backend, summary, "fp16 quality vs ONNX Runtime fp32", reference)
        for weights in args.weights:
            jetson_weights(args.artifact, work / weights, weights, args.backend, summary, reference)
        soak(artifact, args.backend, args.soak_requests, summary)
    return summary.print()


if __name__ == "__main__":
    sys.exit(main())
