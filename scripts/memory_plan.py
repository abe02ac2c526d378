#!/usr/bin/env python3
"""The memory a TensorRT daemon claims for an artifact, part by part, against an 8 GB Orin Nano and a
64 GB AGX Orin (docs/jetson.md "Memory plan").

    python scripts/memory_plan.py --artifact A-fp16 --artifact A-jetson-int4 [--max-batch 4] [--max-seq 1024]

What this machine can measure, it measures: the weights the device engines hold (their graphs'
initializers, which TensorRT keeps in their types: INT4 stays packed), every buffer the daemon claims
at boot (the runtime's own report, `Core.preallocate()`, booted here on ONNX Runtime: the same
buffers, in the same types, as on TensorRT: an fp16 network's KV cache is fp16, half an fp32 one's),
the host tables, the CUDA graphs the boot captures (the plans marked for a graph) and the K/V
append tables reserved for every prefill length. What only a device can report is estimated, and
marked so: the persistent memory of each execution context (one per captured graph, and at most one
per optimization profile for the plans enqueued), TensorRT's activation block (the attention scores and
softmax of a max_seq prefill and two of its MLP activations, in the network's types: fp16 scores and
MLP activations with an fp32 softmax in an fp16 network, all fp32 in an fp32 one: what the largest
engine holds live at once), each CUDA graph's memory, and the CUDA context with TensorRT's libraries.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import onnx
from onnx import TensorProto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.artifact import load_artifact
from edged.backends import kernels, make_backend
from edged.core import Core
from engines.tensorrt import profiles

DEVICE_GRAPHS = ("talker", "code_predictor", "code_predictor_draft", "vocoder")
BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.INT8: 1, TensorProto.INT4: 0.5,
         TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.BOOL: 1}
DEVICE_PARTS = ("kv_cache", "kv_scratch", "predictor_heads", "predictor_scratch", "vocoder_state")
CONTEXT_MIB = (0.03, 8.3)
"""Estimate: persistent device memory each execution context holds for its lifetime, outside the
shared activation block (the smallest and largest "Total per-runner device persistent memory" in
public TensorRT verbose logs); the plan counts the largest. validate_jetson measures it on the device."""
GRAPH_MIB = 0.5
"""Estimate: one captured step's executable graph (a few hundred kernel nodes of about 1-2 KB each)."""
RUNTIME_MIB = (600, 900)
"""Estimate: the CUDA context, cuBLAS/cuDNN handles and TensorRT's libraries on an Orin (JetPack 6)."""
DEVICES = {"Orin Nano 8 GB": (8 * 1024, 1200), "AGX Orin 64 GB": (64 * 1024, 1500)}
"""name -> (MiB of DRAM, MiB the OS and JetPack's services keep, headless; an estimate)."""


def weights_mib(path: Path) -> float:
    model = onnx.load(str(path), load_external_data=False)
    total = 0.0
    for init in model.graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        total += count * BYTES.get(init.data_type, 4)
    return total / 2**20


def activations_mib(heads: int, intermediate: int, t: int, half: bool = False) -> float:
    """Estimate: a T-row prefill's attention scores and softmax [heads, T, T] and two MLP activations
    [T, intermediate]: fp32, or in an fp16 network fp16 scores and activations and an fp32 softmax."""
    width = 2 if half else 4
    return (heads * t * t * (width + 4) + 2 * t * intermediate * width) / 2**20


def plan(path: Path, max_batch: int, max_seq: int, heads: int, intermediate: int) -> dict[str, tuple[float, str]]:
    """part -> (MiB, where it lives / how it was had)."""
    a = replace(load_artifact(path), max_batch=max_batch, max_seq=max_seq)
    core = Core(a, make_backend("onnxruntime", threads=1))
    claimed = core.preallocate()
    t = core.talker
    graphs = sum(p.graphed for plans in t.decode_plans for p in plans.values()) + \
        sum(p.graphed for p in t.predictor_plans) + sum(p.graphed for p in core.vocoder.plans.values())
    tables = sum(x.nbytes for x in a.tables().values()) - t.cp_heads.nbytes  # the heads went to the device
    shared = sum(len(profiles(g)) for g in DEVICE_GRAPHS)  # at most one per profile, for the plans enqueued
    appends = (a.max_seq - 1) * 2 * a.dims.layers * kernels.ROWS.itemsize  # a prefill's table per prompt length
    device = sum(claimed[k] for k in DEVICE_PARTS if k in claimed)
    pinned = sum(v for k, v in claimed.items() if k not in DEVICE_PARTS)
    return {
        "weights (device engines)": (sum(weights_mib(a.file(g)) for g in DEVICE_GRAPHS), "device; measured"),
        "KV cache, K/V scratch, predictor heads and scratch, vocoder state": (device / 2**20, "device; measured"),
        "step I/O, text track, vocoder windows, codec port": (pinned / 2**20, "pinned host; measured"),
        "host tables (embeddings)": (tables / 2**20, "host; measured"),
        "activations (one shared block)": (activations_mib(heads, intermediate, max_seq, a.precision == "fp16"),
                                           "device; estimate"),
        f"CUDA graphs ({graphs} at boot)": (graphs * GRAPH_MIB, "device; estimate"),
        f"execution contexts ({graphs} graphs' own + at most {shared} shared)":
            ((graphs + shared) * CONTEXT_MIB[1], f"device; estimate ({CONTEXT_MIB[0]}-{CONTEXT_MIB[1]} MiB each)"),
        "K/V append tables (every prefill length's)": (appends / 2**20, "device; computed"),
        "CUDA context, TensorRT libraries": (sum(RUNTIME_MIB) / 2, "estimate"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path, action="append", required=True)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16, help="the talker's query heads (Qwen3-TTS 0.6B: 16)")
    p.add_argument("--intermediate", type=int, default=3072, help="the talker's MLP width (Qwen3-TTS 0.6B: 3072)")
    args = p.parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}\n")
    plans = {path: plan(path, args.max_batch, args.max_seq, args.heads, args.intermediate) for path in args.artifact}
    names = [load_artifact(path) for path in args.artifact]
    header = " | ".join(f"{a.precision}{'' if a.weights == 'fp32' else f' + {a.weights} {a.weight_target}'} MiB"
                        for a in names)
    print(f"| part | {header} | where; how |\n|---|{'---|' * len(names)}---|")
    for part in next(iter(plans.values())):
        cells = " | ".join(f"{plans[path][part][0]:.0f}" for path in args.artifact)
        print(f"| {part} | {cells} | {next(iter(plans.values()))[part][1]} |")
    totals = [sum(v for v, _ in plans[path].values()) for path in args.artifact]
    print(f"| total | {' | '.join(f'{t:.0f}' for t in totals)} | |\n")
    for device, (dram, os_mib) in DEVICES.items():
        left = " | ".join(f"{dram - os_mib - t:.0f}" for t in totals)
        print(f"| {device}: left after the OS (~{os_mib} MiB, estimate) and the daemon | {left} | |")
    print(f"\nmax_batch {args.max_batch}, max_seq {args.max_seq}; plan files are memory-mapped (page cache, "
          f"reclaimable), not counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
