#!/usr/bin/env python3
"""What a frame's weights cost at the rate this machine reads memory, at the real Qwen3-TTS 0.6B
dimensions: the floor under generation for each weight form, whatever the kernel.

    python scripts/bench/bandwidth.py [--repeats 7] [--work DIR]

The random real-dimension checkpoint's fp32 artifact and its int8 / int4 twins (the default 128-row
blocks) come from scripts/bench/common.py's cache in `--work`, as scripts/bench/synth.py makes them.
Of each, the talker's and the code predictor's weight products alone (`predictor.products_alone`:
every product of a weight, each fed from an input of its own, nothing else) run in sessions made
with the daemon's ONNX Runtime options at one thread, at 1 and at 4 rows, all in turn, round after
round (ms: the median of `--repeats` rounds after a warm-up). Per form:

- MB a frame: the weights a frame of one member reads, the talker's once and the code predictor's
  15 times (a pass per residual group), and the bound fp32 head each pass reads (one of the stack);
- the products' ms a frame (the talker's + 15 x the code predictor's, the heads not included) at 1
  row and at 4, and the rate in GB/s at which they read their weights at 1 row;
- at the memory's rate: the products' bytes a frame over the rate the fp32 products read theirs at
  1 row. ONNX Runtime's fp32 product of one row reads each 4-byte weight once for two operations,
  which no core keeps up with from memory: its rate is this machine's for a stream of weights (its
  code predictor's 300 MB and talker's 0.8 GB exceed the 32 MB cache). That is what a frame of the
  form's products would cost with any kernel that reads each weight once, at 1 row or at 4.

The quantized forms run once more at MatMulNBits' accuracy level 1 (fp32 activations, each weight
block widened to fp32) beside the daemon's level 4 (int8 activations): which kernel this CPU runs
faster decides edged.backends.onnxruntime.ACCURACY_LEVEL's worth here.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import parser, real_case, variant
from predictor import products_alone, session

FORMS = ("fp32", "int8", "int4")
LEVELS = {"fp32": ("4",), "int8": ("4", "1"), "int4": ("4", "1")}
"""form: the MatMulNBits accuracy levels it runs at (fp32 has no quantized products; the first is the daemon's)."""
GRAPHS = {"talker.onnx": 1, "code_predictor.onnx": 15}
"""graph: its runs a frame (one member)."""
ROWS = (1, 4)


def head_bytes(graph: Path) -> int:
    """Bytes of one head of the code predictor's bound fp32 `heads` [V, hidden, vocab]."""
    import onnx

    heads = next(i for i in onnx.load(str(graph), load_external_data=False).graph.input if i.name == "heads")
    _, hidden, vocab = (d.dim_value for d in heads.type.tensor_type.shape.dim)
    return hidden * vocab * 4


def measure(case, scratch: Path, repeats: int) -> None:
    ways: dict[tuple[str, str, str, int], tuple] = {}
    weight_bytes: dict[tuple[str, str], int] = {}
    heads = 0
    for weights in FORMS:
        art, _ = variant(case, weights)
        heads = head_bytes(art / "code_predictor.onnx")
        for graph in GRAPHS:
            for rows in ROWS:
                out = scratch / f"{weights}-{rows}-{graph}"
                _, weight_bytes[(weights, graph)] = products_alone(art / graph, out, rows)
                for level in LEVELS[weights]:
                    s = session(out, accuracy=level)
                    ways[(weights, level, graph, rows)] = (s, {i.name: np.ones([1, rows, i.shape[2]], np.float32)
                                                               for i in s.get_inputs()})
    spent: dict[tuple[str, str, str, int], list[float]] = {way: [] for way in ways}
    for _ in range(repeats + 1):  # the first round warms up
        for way, (s, feed) in ways.items():
            t0 = time.perf_counter()
            s.run(None, feed)
            spent[way].append((time.perf_counter() - t0) * 1e3)
    ms = {way: float(np.median(v[1:])) for way, v in spent.items()}

    def frame(weights: str, level: str, rows: int) -> float:
        return sum(n * ms[(weights, level, graph, rows)] for graph, n in GRAPHS.items())

    def frame_bytes(weights: str) -> int:
        return sum(n * weight_bytes[(weights, graph)] for graph, n in GRAPHS.items())

    rate = frame_bytes("fp32") / frame("fp32", "4", 1) / 1e6  # GB/s
    print(f"\nms: median of {repeats} rounds; the memory's rate (fp32 products, 1 row): {rate:.1f} GB/s\n")
    print("| weights | MB a frame: talker + 15 x code predictor + 15 heads | products ms a frame, 1 row | 4 rows | "
          "4 / 1 | GB/s, 1 row | at the memory's rate, ms |\n|---|---|---|---|---|---|---|")
    for weights in FORMS:
        mb = {graph: weight_bytes[(weights, graph)] / 1e6 for graph in GRAPHS}
        for level in LEVELS[weights]:
            one, four = frame(weights, level, 1), frame(weights, level, 4)
            name = weights if len(LEVELS[weights]) == 1 else f"{weights}, level {level}"
            print(f"| {name} | {mb['talker.onnx']:.0f} + 15 x {mb['code_predictor.onnx']:.1f} + 15 x {heads / 1e6:.1f}"
                  f" = {(frame_bytes(weights) + 15 * heads) / 1e6:.0f} | {one:.1f} | {four:.1f} | {four / one:.2f} | "
                  f"{frame_bytes(weights) / one / 1e6:.1f} | {frame_bytes(weights) / rate / 1e6:.1f} |")


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, repeats=7).parse_args(argv)
    case = real_case(args.work)
    with tempfile.TemporaryDirectory(prefix="edged-bandwidth-") as scratch:
        measure(case, Path(scratch), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
