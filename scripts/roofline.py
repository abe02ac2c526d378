#!/usr/bin/env python3
"""Each stage's time per frame against its memory roofline, for one artifact on this machine.

    python scripts/roofline.py --artifact ARTIFACT [--threads 2] [--position 64]

1. Bandwidth: the rate at which ONNX Runtime streams a matrix-vector product over 512 MiB of fp32
   weights (the access pattern of every stage at batch 1) with `--threads`, and numpy's
   single-threaded sum over the same bytes, for reference.
2. Bytes each stage reads per frame, from the graphs' initializers: every weight a product reads
   (a quantized weight's INT8/INT4 values and its scales), the tables a stage gathers one row of
   (not counted: a row is nothing), Qwen3-Omni's stacked experts k of E per row, and the KV cache
   rows the decode's attention span reads at `--position` (the decode plan bound for it). The
   talker decodes once per frame; the code predictor runs G-1 passes, each reading its layers and
   one head (`cp_heads`, bound by view), unless speculative verify makes it fewer passes that read
   more heads (callers pass the counts); the vocoder runs once per window of `--chunk-frames` frames.
3. Time: each stage's bound plan alone (the talker's batch-1 decode, one frame of code-predictor
   passes, one vocoder window), median of `--repeats` runs after a warm-up.

Prints per stage: MB read per frame, ms per frame, the roofline (bytes / bandwidth) and the time as
a multiple of it (1.0 = at the roofline).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.artifact import Artifact, load_artifact
from edged.backends import make_backend
from edged.cpu import this_cpu
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

BITS = {TensorProto.FLOAT: 32, TensorProto.FLOAT16: 16, TensorProto.INT8: 8, TensorProto.INT4: 4,
        TensorProto.UINT8: 8, TensorProto.INT64: 64}


def bandwidth(threads: int, mib: int = 512) -> tuple[float, float]:
    """(ORT matrix-vector GB/s, numpy sum GB/s) over `mib` MiB of fp32."""
    k = 4096
    n = mib * 2**20 // 4 // k
    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.ones((1, k), np.float32)
    gemv = median(lambda: session.run(None, {"x": x}), 7)
    total = median(lambda: float(w.sum()), 5)
    return w.nbytes / gemv / 1e9, w.nbytes / total / 1e9


def median(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def weight_bytes(path: Path, experts_read: float = 1.0) -> tuple[float, float]:
    """(bytes of the weights every call reads, bytes of the Gather-read stacks of which a call reads a
    share) of a graph's initializers. A table gathered one row at a time counts nothing."""
    model = onnx.load(str(path), load_external_data=False)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    always, shared = 0.0, 0.0
    for init in model.graph.initializer:
        size = int(np.prod(init.dims)) * BITS.get(init.data_type, 32) / 8
        ops = {n.op_type for n in readers.get(init.name, [])}
        if len(init.dims) < 2 or not ops:
            continue
        if ops <= {"Gather"}:
            if len(init.dims) == 3:  # stacked heads or experts: a call reads a share of them
                shared += size
            continue
        always += size
    return always, shared


def router_share(path: Path) -> float:
    """k / E of a MoE talker graph: the router's TopK (its K the smallest constant one) over the
    stacked experts' first axis (a rewritten graph keeps even its small constants in its external data)."""
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    ks = [int(numpy_helper.to_array(inits[n.input[1]], str(path.parent)).reshape(-1)[0]) for n in model.graph.node
          if n.op_type == "TopK" and n.input[1] in inits]
    experts = max(int(i.dims[0]) for i in model.graph.initializer if len(i.dims) == 3)
    return min(ks) / experts


def stage_bytes(a: Artifact, position: int, chunk_frames: int, passes: float | None = None,
                heads: float | None = None) -> dict[str, float]:
    """Bytes each stage reads per frame; the code predictor's `passes` and `heads` read per frame
    default to the autoregressive G-1 each (speculative verify: passes + verified rows + drafts)."""
    d = a.dims
    talker, experts = weight_bytes(a.file("talker"))
    if experts:  # Qwen3-Omni: a decode row reads k of E experts
        talker += experts * router_share(a.file("talker"))
    from edged.talker.stage import buckets

    span = next(b for b in buckets(a.max_seq) if b >= position)
    kv = 2 * d.layers * d.kv_heads * d.head_dim * span * 4
    cp, _ = weight_bytes(a.file("code_predictor"))
    head = a.tables()["cp_heads"][0].nbytes
    passes = d.code_groups - 1 if passes is None else passes
    heads = d.code_groups - 1 if heads is None else heads
    vocoder, _ = weight_bytes(a.file("vocoder"))
    return {"talker decode": talker + kv, "code predictor": passes * cp + heads * head, "vocoder": vocoder / chunk_frames}


def stage_runs(a: Artifact, threads: int, chunk_frames: int, position: int = 64, window: int = 0) -> dict:
    """One run of each stage, by name: the talker's batch-1 decode at KV `position`, one frame of
    code-predictor passes, one vocoder window (its time / chunk_frames is per frame)."""
    synth = Synthesizer(a, make_backend("onnxruntime", threads=threads), chunk_frames=chunk_frames,
                        first_chunk_frames=chunk_frames)
    voice = next(iter(a.speakers), None)
    synth.synthesize([SpeechRequest("w", "Warm up the plans.", voice=voice, sampling=Sampling.greedy(),
                                    max_frames=2 * chunk_frames)])
    talker, vocoder = synth.core.talker, synth.core.vocoder
    talker.stepping[:1] = True  # row 0 steps: its accepted drafts count
    chunk = vocoder.plans[chunk_frames] if chunk_frames in vocoder.plans else next(iter(vocoder.plans.values()))
    return {"talker decode": talker.decode_plan(1, position).run, "code predictor": lambda: talker.predict(1, window),
            "vocoder": chunk.run}


def stage_times(a: Artifact, threads: int, repeats: int, chunk_frames: int, position: int = 64,
                window: int = 0) -> dict[str, float]:
    runs = stage_runs(a, threads, chunk_frames, position, window)
    times = {name: median(run, repeats) for name, run in runs.items()}
    return {**times, "vocoder": times["vocoder"] / chunk_frames}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path, default=None, help="default: the built-in tiny artifact")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--position", type=int, default=64, help="KV cache rows in use for the talker's decode")
    p.add_argument("--chunk-frames", type=int, default=4)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    a = load_artifact(args.artifact)
    gemv, summed = bandwidth(args.threads)
    print(f"command: python {' '.join(sys.argv)}")
    print(f"cpu: {this_cpu().line()}, {os.cpu_count()} logical cores")
    print(f"bandwidth: {gemv:.1f} GB/s streaming fp32 weights through ONNX Runtime ({args.threads} threads), "
          f"{summed:.1f} GB/s numpy sum (1 thread)")
    print(f"artifact: {a.path} ({a.family}, weights {a.weights}, precision {a.precision})\n")
    nbytes = stage_bytes(a, args.position, args.chunk_frames)
    times = stage_times(a, args.threads, args.repeats, args.chunk_frames, args.position)
    print("| stage | MB read / frame | ms / frame | roofline ms | x roofline |")
    print("|---|---|---|---|---|")
    for stage, size in nbytes.items():
        roof = size / (gemv * 1e9)
        print(f"| {stage} | {size / 1e6:.1f} | {times[stage] * 1e3:.2f} | {roof * 1e3:.2f} | {times[stage] / roof:.2f} |")
    total_t, total_b = sum(times.values()), sum(nbytes.values())
    print(f"| all | {total_b / 1e6:.1f} | {total_t * 1e3:.2f} | {total_b / gemv / 1e6:.2f} | "
          f"{total_t / (total_b / (gemv * 1e9)):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
