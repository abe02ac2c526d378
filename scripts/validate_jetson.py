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
   reference takes; then CUDA graphs: every step plan marked for a graph captured (a failed capture
   is named: which plan, why), the same cohort with graphs and with per-run enqueues giving equal
   frames (and again after other plans re-bound the shared contexts: each captured graph has a
   context of its own), and replay faster per frame than enqueue; activation memory: the one block
   every execution context shares, against what kSTATIC contexts would claim each; memory by stage
   from MemAvailable (CUDA context, engines, boot, warm-up), each context's persistent memory (16 more
   made) against the memory plan's estimate, and an 8 GB device left with at least HEADROOM_MIB;
   launches per step: exactly one graph launch per plan of a talker step at max_batch (the K/V
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
   engines/weight_form.py); then, against the fp16 twin (built for it), that int4 is really int4:
   the plans' size (at most INT4_SIZE of fp16's), the engine inspector's layers (INT4 weights feed
   the GEMMs, none dequantized by a layer of its own; the JSON is kept as talker.layers.json), and
   the talker's ms per frame (no worse than fp16's);
6. soak: the daemon as the installed edged.service (`--soak service`, the default on tensorrt: its
   user, groups, sandbox, CUDA_CACHE_PATH and watchdog; scripts/validate_service.py) or directly
   (`--soak direct`), 4 clients at once, N requests each: every one done, no restart or watchdog
   timeout, time to first audio (p50/p95), RTF, per-stage milliseconds per frame, peak memory
   (tegrastats when present); boot time: the daemon's own (its log: plans loaded, buffers claimed,
   CUDA graphs captured, warm-up) against the unit's TimeoutStartSec, and the graphs it captured;
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
from memory_plan import CONTEXT_MIB
from summary import Summary
from validate_service import Direct, Service

from edged.artifact import BUILTIN, load_artifact
from edged.backends import make_backend
from edged.backends.plan_file import open_plan
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


def jetson_weights(source: Path, twin: Path, weights: str, backend: str, summary: Summary, reference: list,
                   fp16: Path | None) -> None:
    """The `--weights int4` rows: the Jetson form (an fp16 network with INT4 weights) made from the fp32
    artifact, its plans, its frames on this backend against the same form on ONNX Runtime, and
    against ONNX Runtime fp32 (`reference`); then, against the fp16 twin's plans (`fp16`), whether it
    is really int4 (`int4_plans`)."""
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
        if backend == "tensorrt" and fp16 is not None:
            int4_plans(fp16, twin, backend, summary)


INT4_SIZE = 0.6
"""The int4 talker and code-predictor plans against the fp16 ones: INT4 weights are a quarter of fp16's,
plus fp16 scales per 128-row block, the fp16 embeddings and heads, and the engine's own data."""


def int4_plans(fp16: Path, int4: Path, backend: str, summary: Summary) -> None:
    """Three rows that an int4 plan is int4: its size against the fp16 plan's (at most INT4_SIZE), the
    engine inspector's layers (the INT4 weights feed the GEMMs; none is dequantized by a layer of its
    own at run time; the JSON is kept beside the plan for a report), and the talker's milliseconds per
    frame, no worse than fp16's on this device."""
    import tensorrt as trt

    graphs = ("talker.plan", "code_predictor.plan")
    sizes = [sum((art / g).stat().st_size for g in graphs) for art in (fp16, int4)]
    summary.add("int4 plan size", sizes[1] <= INT4_SIZE * sizes[0],
                f"talker + code predictor {sizes[1] / 2**20:.0f} MiB against fp16's {sizes[0] / 2**20:.0f} MiB "
                f"({sizes[1] / sizes[0]:.2f}; at most {INT4_SIZE})")
    device = make_backend(backend)  # a CUDA context for the engine
    try:
        with open_plan(int4 / "talker.plan", int4 / "talker.onnx", trt.__version__) as (_, serialized):
            engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(serialized)
        layers = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
        del engine
    finally:
        device.close()
    (int4 / "talker.layers.json").write_text(layers)
    ok, detail = int4_evidence(layers)
    summary.add("int4 GEMMs (engine inspector)", ok, f"{detail}; layers in {int4 / 'talker.layers.json'}")
    talker16, _ = stage_ms(synthesize(fp16, backend))
    talker4, _ = stage_ms(synthesize(int4, backend))
    summary.add("int4 talker speed", talker4 <= talker16,
                f"talker {talker4:.1f} ms per frame at int4, {talker16:.1f} ms at fp16 (no worse)")


GEMM = re.compile(r"gemm|matmul|matrix|myelin|cask", re.I)
DEQUANTIZE = re.compile(r"dequantize", re.I)


def int4_evidence(layers_json: str) -> tuple[bool, str]:
    """Whether the inspector's layers (LayerInformationFormat.JSON of a DETAILED plan: {"Layers": [{"Name",
    "LayerType", "Inputs": [{"Format/Datatype"}], "Outputs", "Weights": {"Type"}, ...}]}, as
    trt-engine-explorer reads it) show INT4 weights feeding GEMMs ("Int4" in a GEMM layer's inputs or
    weights) and no layer of its own that dequantizes INT4 at run time (a Dequantize layer reading Int4)."""
    import json

    found = json.loads(layers_json).get("Layers", [])
    if not found or not all(isinstance(layer, dict) for layer in found):
        return False, "no detailed layer information (the plan was built without ProfilingVerbosity.DETAILED)"
    int4 = [layer for layer in found if "int4" in json.dumps(layer).lower()]
    gemms = [layer for layer in int4 if GEMM.search(f"{layer.get('LayerType', '')} {layer.get('Name', '')}")]
    dequantized = [layer for layer in int4 if DEQUANTIZE.search(f"{layer.get('LayerType', '')} {layer.get('Name', '')}")
                   and not GEMM.search(str(layer.get("LayerType", "")))]
    detail = (f"{len(found)} layers; {len(gemms)} GEMM layers take INT4 weights; {len(dequantized)} layers dequantize "
              f"INT4 on their own" + (f" (e.g. {dequantized[0].get('Name')})" if dequantized else ""))
    return bool(gemms) and not dequantized, detail


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

    runs, rebound, report = {}, [], {}
    for graphs in (True, False):
        engines = make_backend(backend, cuda_graphs=graphs)
        try:
            synth = Synthesizer(load_artifact(artifact), engines)
            runs[graphs] = synth.synthesize(cohort())
            if graphs:
                report = engines.graph_report()
                synth.synthesize([SpeechRequest(f"v{i}", t, sampling=Sampling(seed=i, cp_spec_verify_size=2),
                                                max_frames=20) for i, t in enumerate(TEXTS)])
                rebound = synth.synthesize(cohort())
        finally:
            engines.close()
    same = all(np.array_equal(a.frames, b.frames) for a, b in zip(runs[True], runs[False]))
    still = all(np.array_equal(a.frames, b.frames) for a, b in zip(rebound, runs[False]))
    per_frame = {graphs: stage_ms(results) for graphs, results in runs.items()}
    (talker_g, vocoder_g), (talker_e, vocoder_e) = per_frame[True], per_frame[False]
    speedup = (talker_e + vocoder_e) / max(talker_g + vocoder_g, 1e-9)
    failed = "".join(f"; NOT CAPTURED {f['plan']}: {f['why']}" for f in report["failed"])
    every = report["captured"] == report["marked"] > 0 and not report["failed"]
    summary.add("CUDA graphs", same and still and every and speedup > 1,
                f"{report['captured']} of {report['marked']} step plans captured{failed}; frames equal: {same}; after "
                f"other plans re-bound the contexts: {still}; per frame with graphs: talker {talker_g:.1f} ms, vocoder "
                f"{vocoder_g:.1f} ms; enqueued: talker {talker_e:.1f} ms, vocoder {vocoder_e:.1f} ms ({speedup:.2f}x: "
                f"replay must be faster)")


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


HEADROOM_MIB = 1024
"""What an 8 GB Orin Nano must keep available (MemAvailable) once the daemon booted and warmed up: the
page cache the plans are read through, the transcription server and LLM beside it."""
EXTRA_CONTEXTS = 16


def mem_available() -> int:
    """MemAvailable (bytes) from /proc/meminfo: on Tegra the GPU's memory is this DRAM, and CUDA's own
    free-memory figure (cudaMemGetInfo) does not count what the kernel could reclaim."""
    return _meminfo("MemAvailable")


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {field}")


def memory_by_stage(artifact: Path, backend_name: str, summary: Summary) -> None:
    """The memory the daemon's boot takes on the device, stage by stage, from MemAvailable: the CUDA
    context (and TensorRT's libraries), the engines (their weights), the boot (buffers, the activation
    block, execution contexts, CUDA graphs) and one warm-up synthesis; then the cost of one execution
    context, from EXTRA_CONTEXTS more made on the talker's engine (USER_MANAGED, on the shared block),
    against the memory plan's estimate (scripts/memory_plan.py CONTEXT_MIB). FAIL on an 8 GB device
    left with less than HEADROOM_MIB available, or a context dearer than the plan's estimate."""
    if backend_name != "tensorrt":
        summary.add("memory by stage", None, "TensorRT only")
        return
    import tensorrt as trt

    marks = [("before", mem_available())]
    backend = make_backend(backend_name)
    try:
        marks.append(("CUDA context", mem_available()))
        core = Core(load_artifact(artifact), backend)
        marks.append(("engines", mem_available()))
        claimed = sum(core.preallocate().values()) + backend.activation_bytes()
        contexts = sum(len(e.contexts()) for e in backend.engines)
        marks.append(("boot", mem_available()))
        core.warm_up()
        marks.append(("warm-up", mem_available()))
        talker = next(e for e in backend.engines if e.name == "talker.onnx")
        extra = []
        for _ in range(EXTRA_CONTEXTS):
            context = talker.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            context.set_device_memory(int(backend.activations), talker.activation_bytes)
            extra.append(context)
        per_context = (marks[-1][1] - mem_available()) / EXTRA_CONTEXTS / 2**20
        del extra
    finally:
        backend.close()
    steps = "; ".join(f"{name} {(marks[i][1] - value) / 2**20:.0f} MiB"
                      for i, (name, value) in enumerate(marks[1:]))
    left = marks[-1][1] / 2**20
    small = _meminfo("MemTotal") <= 8.5 * 2**30
    ok = per_context <= CONTEXT_MIB[1] and (left >= HEADROOM_MIB or not small)
    summary.add("memory by stage", ok,
                f"{steps} (buffers and activations claimed: {claimed / 2**20:.0f} MiB); {contexts} execution "
                f"contexts at {per_context:.2f} MiB each (memory plan: at most {CONTEXT_MIB[1]}); MemAvailable after "
                f"warm-up {left:.0f} MiB" + (f" (an 8 GB device must keep {HEADROOM_MIB})" if small else ""))


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
        report = backend.graph_report()
        captured = report["captured"] == report["marked"] and not report["failed"]
        summary.add("launches per step", per_step == plans and captured,
                    f"{per_step:.1f} at batch {a.max_batch} (must be {plans}: one graph launch per plan; "
                    f"{report['captured']} of {report['marked']} step plans captured; "
                    f"{2 * a.dims.layers * a.max_batch} K/V copies before)")
    finally:
        backend.close()


def stage_ms(reports: list) -> tuple[float, float]:
    """Talker and vocoder milliseconds per frame over `reports` (dicts, or results carrying `.report`)."""
    reports = [getattr(r, "report", r) for r in reports]
    frames = max(sum(r["frames"] for r in reports), 1)
    return (sum(r["stages"][0]["step_ms"] for r in reports) / frames,
            sum(r["stages"][1]["vocoder_ms"] for r in reports) / frames)


def soak(artifact: Path, backend: str, requests: int, summary: Summary, service: bool) -> None:
    """4 clients at once, `requests` each, on the daemon run as the installed edged.service (`service`)
    or directly; then its boot time from its log and a SIGTERM that must end in exit 0."""
    from edged.client import Client

    try:
        daemon = (Service if service else Direct)(artifact, backend)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        summary.add("soak", False, str(exc))
        return
    memory = Tegrastats()
    reports: list[dict] = []
    failures: list[str] = []
    try:
        wait_ready(daemon)
        memory.start()

        def client(i: int) -> None:
            with Client(daemon.endpoint, timeout_s=300) as c:
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
        problems = daemon.problems()
        summary.add("soak", not failures and not problems and len(reports) == 4 * requests,
                    f"{daemon.what}: {len(reports)}/{4 * requests} done in {wall:.1f} s; TTFA p50 {pct(ttfa, 50):.0f} "
                    f"ms, p95 {pct(ttfa, 95):.0f} ms; RTF p50 {statistics.median(r['rtf'] for r in reports):.3f}; per "
                    f"frame: talker {talker:.1f} ms, vocoder {vocoder:.1f} ms; prefill p50 {prefill:.0f} ms; "
                    f"{memory.describe()}" + "".join(f"; {p}" for p in problems))
        boot_time(daemon.log(), summary)
        code = daemon.terminate()
        closed = f"closed the {backend} backend" in daemon.log()
        summary.add("SIGTERM", code == 0 and closed, f"{daemon.what}: exit code {code}; backend closed: {closed}")
    finally:
        daemon.close()


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


def wait_ready(daemon) -> None:
    from edged.client import Client
    from edged.locate import NoDaemon

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise RuntimeError(f"{daemon.what} is not running:\n{daemon.log()[-3000:]}")
        try:
            with Client(daemon.endpoint, timeout_s=1) as c:
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
    p.add_argument("--soak", choices=["service", "direct"], default=None,
                   help="run the soak's daemon as the installed edged.service (default on tensorrt: `sudo make "
                        "install-system` first) or directly (default on onnxruntime)")
    args = p.parse_args()
    args.soak = args.soak or ("service" if args.backend == "tensorrt" else "direct")
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
        memory_by_stage(artifact, args.backend, summary)
        launches_per_step(artifact, args.backend, summary)
        fp16: Path | None = None
        if args.fp16 or args.weights:  # the int4 rows measure against the fp16 twin
            fp16 = work / "fp16"
            made = subprocess.run([sys.executable, "-m", "engines.cli", "fp16", "--artifact", str(args.artifact),
                                   "--out", str(fp16)], capture_output=True, text=True)
            if made.returncode:
                summary.add("fp16 artifact", False, made.stderr.strip()[-300:])
                fp16 = None
            elif plans(fp16, args.backend, summary, "plans (fp16, strongly typed)"):
                parity(fp16, args.backend, summary, "fp16 quality vs ONNX Runtime fp32", reference)
            else:
                fp16 = None
        for weights in args.weights:
            jetson_weights(args.artifact, work / weights, weights, args.backend, summary, reference, fp16)
        soak(artifact, args.backend, args.soak_requests, summary, service=args.soak == "service")
    return summary.print()


if __name__ == "__main__":
    sys.exit(main())
