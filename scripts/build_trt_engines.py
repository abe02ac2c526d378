#!/usr/bin/env python3
"""Build TensorRT plans for an edged artifact, on the device (Jetson, TensorRT 10).

    python3 scripts/build_trt_engines.py ARTIFACT [--fp16] [--window FRAMES]

Writes `<graph>.plan` beside each `<graph>.onnx`, one optimization profile per graph spanning the
artifact's limits: batch 1..max_batch (decode, code predictor), prefill length 1..max_seq, vocoder
window 1..FRAMES (left context + chunk; edged's default is 72 + 4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tensorrt as trt


def dynamic_sizes(graph: str, limits: dict, window: int) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) for each dynamic dim, by the axis' role in the graph contract."""
    batch = (1, limits["max_batch"], limits["max_batch"])
    return {
        "talker_prefill": {"T": (1, min(64, limits["max_seq"]), limits["max_seq"])},
        "talker_decode": {"B": batch},
        "code_predictor": {"B": batch},
        "vocoder": {"B": (1, 1, limits["max_batch"]), "F": (1, window, window)},
    }[graph]


def build(onnx_path: Path, sizes: dict, fp16: bool) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SystemExit(f"{onnx_path.name}: ONNX parse failed: {errors}")
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = list(tensor.shape)
        if all(d >= 0 for d in shape):
            continue
        # The exporter names batch axes first and sequence/frame axes last; map -1s by position.
        roles = ["B", "T", "F"]
        lo, opt, hi = [], [], []
        for axis, d in enumerate(shape):
            if d >= 0:
                lo.append(d), opt.append(d), hi.append(d)
                continue
            role = next(r for r in roles if r in sizes and (r == "B") == (axis == 0))
            a, b, c = sizes[role]
            lo.append(a), opt.append(b), hi.append(c)
        profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SystemExit(f"{onnx_path.name}: TensorRT build failed")
    return bytes(plan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--window", type=int, default=76)
    args = parser.parse_args()
    manifest = json.loads((args.artifact / "artifact.json").read_text())
    for graph in ("talker_prefill", "talker_decode", "code_predictor", "vocoder"):
        onnx_path = args.artifact / manifest["files"][graph]
        plan = build(onnx_path, dynamic_sizes(graph, manifest["limits"], args.window), args.fp16)
        onnx_path.with_suffix(".plan").write_bytes(plan)
        print(f"{onnx_path.with_suffix('.plan').name}: {len(plan)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
