#!/usr/bin/env python3
"""What a cohort of four costs generation at the real Qwen3-TTS 0.6B dimensions, int4: the talker's
step and the code predictor's pass at batch 1 and 4, by operator, and one int4 product alone at 1, 2,
4 and 8 rows.

    python scripts/bench/cohort.py [--repeats 5] [--work DIR]

The int4 twin (default 128-row blocks) of the random real-dimension checkpoint comes from
scripts/bench/common.py's cache in `--work`, as scripts/bench/synth.py makes it. Sessions are made
with the daemon's ONNX Runtime options (OrtBackend.session_options) at one thread. Each graph is fed
one greedy step (common.step_feed: the talker 64 cache slots valid, a pass 12) for 1 and for 4
members, timed in turn round after round (the median of `--repeats` rounds after a warm-up), then
profiled by operator at both sizes. Last, one product the size of the code predictor's MLP (K 1024,
N 3072) quantized to int4 as `edged-engines quantize` does (symmetric, 128-row blocks), run by
ONNX Runtime's MatMulNBits at accuracy level 4 (int8 activations: the daemon's) and 0 (fp32), at
1, 2, 4 and 8 rows: whether a product's cost grows with the rows it multiplies.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import parser, profiled, real_case, step_feed, variant

GRAPHS = {"talker.onnx": ({"T": 1, "L": 64, "P": 256}, 60, 5),
          "code_predictor.onnx": ({"T": 1, "V": 1, "P": 16}, 12, 30)}
"""graph: (its dims but the batch, the members' position, calls per timed batch)."""
ROWS = (1, 2, 4, 8)


def graphs(art: Path, repeats: int) -> None:
    import onnxruntime as ort

    from edged.backends.onnxruntime import OrtBackend

    opts = OrtBackend(1).session_options()
    for graph, (dims, position, calls) in GRAPHS.items():
        session = ort.InferenceSession(str(art / graph), opts, providers=["CPUExecutionProvider"])
        feeds = {b: step_feed(art / graph, {**dims, "B": b}, position) for b in (1, 4)}
        spent: dict[int, list[float]] = {b: [] for b in feeds}
        for _ in range(repeats + 1):  # the first round warms up
            for b, feed in feeds.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    session.run(None, feed)
                spent[b].append((time.perf_counter() - t0) * 1e3 / calls)
        ms = {b: float(np.median(v[1:])) for b, v in spent.items()}
        by_op = {b: Counter() for b in feeds}
        for b, feed in feeds.items():
            for _, op, op_ms in profiled(art / graph, 1, feed):
                by_op[b][op] += op_ms
        name = graph.removesuffix(".onnx")
        print(f"\n{name}: batch 1 {ms[1]:.2f} ms, batch 4 {ms[4]:.2f} ms a call ({ms[4] / ms[1]:.2f}x), "
              f"median of {repeats} interleaved rounds; profiled by operator:\n")
        print("| operator | batch 1 ms | batch 4 ms | batch 4 / 1 |\n|---|---|---|---|")
        for op in sorted(by_op[4], key=lambda o: -by_op[4][o])[:6]:
            print(f"| {op} | {by_op[1][op]:.3f} | {by_op[4][op]:.3f} | {by_op[4][op] / max(by_op[1][op], 1e-9):.2f} |")


def product(repeats: int, k: int = 1024, n: int = 3072, calls: int = 200) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edged.backends.onnxruntime import OrtBackend
    from engines.quantize import quantize_model
    from engines.weight_form import form

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="product")], "product",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    quantize_model(model, form("int4", "cpu", 128))
    sessions = {}
    for level in ("4", "0"):
        opts = OrtBackend(1).session_options()
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", level)
        sessions[level] = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {m: {"x": rng.standard_normal((m, k)).astype(np.float32)} for m in ROWS}
    spent: dict[tuple[str, int], list[float]] = {(level, m): [] for level in sessions for m in ROWS}
    for _ in range(repeats + 1):
        for (level, m) in spent:
            t0 = time.perf_counter()
            for _ in range(calls):
                sessions[level].run(None, feeds[m])
            spent[(level, m)].append((time.perf_counter() - t0) * 1e6 / calls)
    print(f"\none int4 product, K {k}, N {n}, 128-row blocks (MatMulNBits), us a call, median of {repeats} "
          f"interleaved rounds\n")
    print("| accuracy level | " + " | ".join(f"{m} row{'s' * (m > 1)}" for m in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for level in sessions:
        print(f"| {level} | " + " | ".join(f"{float(np.median(spent[(level, m)][1:])):.1f}" for m in ROWS) + " |")


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, repeats=5).parse_args(argv)
    art, notes = variant(real_case(args.work), "int4")
    print("\n".join(notes), flush=True)
    graphs(art, args.repeats)
    product(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
