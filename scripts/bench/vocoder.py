#!/usr/bin/env python3
"""The vocoder graph alone at the real Qwen3-TTS 0.6B dimensions: what a window costs, whether one
call for a cohort costs less than a call per member, and where the time goes.

    python scripts/bench/vocoder.py [--threads 1] [--repeats 5] [--batch 4] [--frames 4] [--work DIR]

The random real-dimension checkpoint's fp32 artifact comes from scripts/bench/common.py's cache in
`--work` (every weight form keeps the vocoder in fp32). Sessions are made by the daemon's own ONNX
Runtime backend (its options and thread count). Each round times `--batch` windows of `--frames`
frames three ways, in turn, so drift on a shared machine hits them alike: one call per member
(batch 1, as the daemon decodes today), one call for them all (batch B), and two calls of B / 2;
the median of `--repeats` rounds after a warm-up round. Then one profiled session gives the time
per operator type of a batch-1 window. Every call starts from the same state (a window
`--frames` frames into a stream), which is what a streaming window costs.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import machine, prepare_case, profiled


def feeds(artifact, batch: int, frames: int) -> dict[str, np.ndarray]:
    """A window of `frames` random codes for `batch` members, `frames` frames into their streams."""
    rng = np.random.default_rng(0)
    g = artifact.dims.code_groups
    out = {"codes": rng.integers(0, artifact.dims.codebook_size, (batch, g, frames)).astype(np.int64),
           "start": np.full(batch, frames, np.int64)}
    for spec in artifact.graphs["vocoder"].state:
        out[spec.input] = np.zeros((batch, *spec.shape), np.float32)
    return out


def timed(session, feed: dict[str, np.ndarray], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - t0) * 1e3


def profile(path: Path, threads: int, feed: dict[str, np.ndarray]) -> list[tuple[str, float, int]]:
    """(operator type, ms per call, nodes) of a profiled session, the largest first."""
    spent: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    for _, op, ms in profiled(path, threads, feed):
        spent[op] += ms
        nodes[op] += 1
    return [(op, ms, nodes[op]) for op, ms in spent.most_common()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=4, help="frames per window (the daemon's chunk_frames)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench")
    args = p.parse_args(argv)
    if args.batch < 2 or args.batch % 2:
        p.error("--batch must be even and at least 2")
    from edged.artifact import load_artifact
    from edged.backends.onnxruntime import OrtBackend

    print("\n".join(machine()), flush=True)
    artifact = load_artifact(prepare_case("real", args.work, 16, 256, 0).artifact)
    path = artifact.file("vocoder")
    session = OrtBackend(args.threads).load(path).session  # type: ignore[attr-defined]
    b, f = args.batch, args.frames
    ways = {f"{b} calls of batch 1": (feeds(artifact, 1, f), b),
            f"1 call of batch {b}": (feeds(artifact, b, f), 1),
            f"2 calls of batch {b // 2}": (feeds(artifact, b // 2, f), 2)}
    spent: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.repeats + 1):  # the first round warms up
        for way, (feed, calls) in ways.items():
            spent[way].append(timed(session, feed, calls))
    print(f"\n{b} windows of {f} frames, {args.threads} thread(s), median of {args.repeats} interleaved rounds\n")
    print("| decoded as | ms for the windows | ms per frame |\n|---|---|---|")
    for way, ms in spent.items():
        median = float(np.median(ms[1:]))
        print(f"| {way} | {median:.1f} | {median / (b * f):.2f} |")
    ops = profile(path, args.threads, feeds(artifact, 1, f))
    total = sum(ms for _, ms, _ in ops)
    print(f"\none batch-1 window of {f} frames, profiled: {total:.1f} ms in kernels\n")
    print("| operator | ms | nodes | share |\n|---|---|---|---|")
    for op, ms, n in ops[:8]:
        print(f"| {op} | {ms:.1f} | {n} | {100 * ms / total:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
