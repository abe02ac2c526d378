#!/usr/bin/env python3
"""Two artifacts' talker step and code-predictor pass side by side: the same feeds, outputs compared,
timed in turn.

    python scripts/bench/graphs.py OLD NEW [--repeats 9]

OLD and NEW are artifacts of one checkpoint in one weight form (say, exported before and after a
change to engines/): every output of NEW must equal OLD's to be a like-for-like comparison, and the
largest difference of each is printed. Sessions are made with the daemon's ONNX Runtime options at
one thread. The feeds are one member's greedy step: the talker's decode of 1 row at position 60 over
64 of 256 cache slots, and a plain code-predictor pass (1 row, 1 verified) at position 12 over 16.
Each graph of each artifact is timed a batch of calls at a time (60 passes, 10 talker steps), all
in turn, round after round: ms per call, the median of `--repeats` rounds after a warm-up round.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np
from common import machine, step_feed

CASES = {"talker.onnx": ({"B": 1, "T": 1, "L": 64, "P": 256}, 60, 10),
         "code_predictor.onnx": ({"B": 1, "T": 1, "V": 1, "P": 16}, 12, 60)}
"""graph: (its dims, the member's position, calls per timed batch)."""


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    from edged.backends.onnxruntime import OrtBackend

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    print("\n".join(machine()), flush=True)
    opts = OrtBackend(1).session_options()
    ways = {}
    for graph, (dims, position, calls) in CASES.items():
        f = step_feed(args.old / graph, dims, position)
        for side in ("old", "new"):
            session = ort.InferenceSession(str(getattr(args, side) / graph), opts, providers=["CPUExecutionProvider"])
            ways[(graph, side)] = (session, f, calls)
        old, new = (ways[(graph, side)][0] for side in ("old", "new"))
        names = [o.name for o in old.get_outputs()]
        gaps = {n: float(np.abs(a.astype(np.float64) - b).max()) for n, a, b in zip(names, old.run(None, f), new.run(None, f))}
        print(f"{graph}: largest |old - new| of {len(gaps)} outputs {max(gaps.values()):.3g}"
              + ("" if max(gaps.values()) == 0 else f" ({', '.join(n for n, g in gaps.items() if g)})"))
    spent: dict[tuple[str, str], list[float]] = {way: [] for way in ways}
    for _ in range(args.repeats + 1):  # the first round warms up
        for way, (session, f, calls) in ways.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                session.run(None, f)
            spent[way].append((time.perf_counter() - t0) * 1e3 / calls)
    print(f"\nms per call, median of {args.repeats} interleaved rounds\n")
    print("| graph | old ms | new ms | new / old |\n|---|---|---|---|")
    for graph in CASES:
        old, new = (float(np.median(spent[(graph, side)][1:])) for side in ("old", "new"))
        print(f"| {graph.removesuffix('.onnx')} | {old:.3f} | {new:.3f} | {new / old:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
