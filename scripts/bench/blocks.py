#!/usr/bin/env python3
"""The CPU form's block size: ONNX Runtime's MatMulNBits time and the model's decisions with int8 and
int4 weights in 32- to 256-row blocks, side by side in one run at the real Qwen3-TTS 0.6B
dimensions.

    python scripts/bench/blocks.py [--threads 2] [--repeats 7] [--frames 24] [--work DIR] [--no-quality]

The random real-dimension checkpoint and its fp32 artifact come from scripts/bench/common.py's
cache in `--work` (as scripts/bench/weights.py makes them); each quantized twin
(`edged-engines quantize --target cpu --block B`) is cached beside it. The twins of one weight type
are timed in one fresh process, in turn, round after round: the talker's batch-1 decode at KV
position 64 and one frame of code-predictor passes, the median of `--repeats` rounds. Then
scripts/quant_quality.py compares every twin with fp32, teacher-forced.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import cached, parser, real_case, unloadable

FORMS = (("int8", 32), ("int8", 128), ("int8", 256), ("int4", 32), ("int4", 64), ("int4", 128), ("int4", 256))


def measure(artifacts: list[Path], threads: int, repeats: int) -> list[dict[str, float]]:
    """Each artifact's talker decode and code-predictor frame in ms, the median of `repeats` rounds
    that time every artifact in turn (so drift on a shared machine hits them alike)."""
    import time

    import numpy as np
    from roofline import stage_runs

    from edged.artifact import load_artifact

    runs = [stage_runs(load_artifact(a), threads, 4) for a in artifacts]
    times: list[dict[str, list[float]]] = [{"talker decode": [], "code predictor": []} for _ in artifacts]
    for _ in range(repeats + 1):  # the first round warms up
        for stages, timed in zip(runs, times):
            for name, spent in timed.items():
                t0 = time.perf_counter()
                stages[name]()
                spent.append((time.perf_counter() - t0) * 1e3)
    return [{name: float(np.median(spent[1:])) for name, spent in timed.items()} for timed in times]


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=24, help="teacher-forced frames per text (quant_quality.py)")
    p.add_argument("--quality", action=argparse.BooleanOptionalAction, default=True,
                   help="also the teacher-forced comparison with fp32 (minutes per twin)")
    p.add_argument("--measure", type=Path, nargs="+", help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.threads, args.repeats)))
        return 0
    from engines.quantize import quantize_artifact

    fp32 = real_case(args.work).artifact
    twins = {}
    for weights, block in FORMS:
        out = fp32.with_name(f"{fp32.name}-{weights}-cpu-b{block}")
        print(cached(out, f"{weights} block {block}",
                     lambda out, w=weights, b=block: quantize_artifact(fp32, out, w, "cpu", b), unloadable), flush=True)
        twins[weights, block] = out
    print("\n| weights | block | talker decode ms | code predictor ms / frame |\n|---|---|---|---|")
    for weights in ("int8", "int4"):
        mine = [(block, path) for (w, block), path in twins.items() if w == weights]
        if not mine:
            continue
        done = subprocess.run([sys.executable, __file__, "--measure", *(str(p) for _, p in mine), "--threads",
                               str(args.threads), "--repeats", str(args.repeats)], check=True, capture_output=True,
                              text=True)
        for (block, _), ms in zip(mine, json.loads(done.stdout.strip().splitlines()[-1])):
            print(f"| {weights} | {block} | {ms['talker decode']:.1f} | {ms['code predictor']:.1f} |", flush=True)
    print(f"\nbatch 1, {args.threads} threads, median of {args.repeats} interleaved rounds; talker decode at KV "
          f"position 64\n", flush=True)
    if not args.quality:
        return 0
    import quant_quality

    return quant_quality.main(["--fp32", str(fp32), "--quantized", *map(str, twins.values()), "--frames",
                               str(args.frames), "--threads", str(args.threads)])


if __name__ == "__main__":
    sys.exit(main())
