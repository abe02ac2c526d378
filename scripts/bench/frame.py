#!/usr/bin/env python3
"""Where a frame's generation time goes at the real Qwen3-TTS 0.6B dimensions: the talker's decode,
each of the code predictor's passes, and the host's work around them (sampling inputs, the codec
embeddings' gathers and sums, copies), as the daemon's own talker stage runs them; then each graph's
time by operator.

    python scripts/bench/frame.py [--weights int4] [--frames 48] [--repeats 3] [--work DIR]

The run is `edged bench`'s (edged.bench.timed: a Synthesizer, one greedy member, threads
generation=1,vocoder=1) on the `--weights` twin of the random real-dimension checkpoint from
scripts/bench/common.py's cache. Every bound plan's `run()` is timed from outside (OrtPlan.run
wrapped: the stage's own code runs unchanged), so per step the stage's own `step_ms`
(edged/talker/stage.py) less its plans' time is the host's share. Means over the steps of the
middle run by wall time, after a warm-up run (means, as step_ms is one: the parts add up to it).
Last, the talker step and one code-predictor pass fed as the daemon feeds them (common.step_feed)
and profiled by operator in sessions made with the daemon's options at one thread.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import parser, profiled, real_case, step_feed, variant

from edged.artifact import load_artifact
from edged.backends import onnxruntime as edged_ort
from edged.bench import requests, timed
from edged.synth import Synthesizer

PROFILED = {"talker.onnx": ({"T": 1, "L": 64, "P": 256}, 60), "code_predictor.onnx": ({"T": 1, "V": 1, "P": 16}, 12)}
"""graph: (its dims but the batch, the member's position) for the by-operator profile."""


class PlanClock:
    """Wall time of every OrtPlan.run, by the graph file its session loaded, in call order."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = defaultdict(list)
        self.names: dict[int, str] = {}
        self.run = edged_ort.OrtPlan.run

    def __enter__(self) -> PlanClock:
        clock, run = self, self.run

        def timed_run(plan) -> None:
            t0 = time.perf_counter()
            run(plan)
            clock.calls[clock.names.get(id(plan._session), "?")].append((time.perf_counter() - t0) * 1e3)

        edged_ort.OrtPlan.run = timed_run
        return self

    def __exit__(self, *exc) -> None:
        edged_ort.OrtPlan.run = self.run

    def learn(self, synth: Synthesizer) -> None:
        backends = [synth.core.talker.backend, synth.core.vocoder.backend]
        self.names = {id(e.session): e.path.name for b in backends for e in b.engines}


def frame_parts(art: Path, frames: int, repeats: int) -> None:
    artifact = load_artifact(art)
    backend = edged_ort.OrtBackend(1)
    synth = Synthesizer(artifact, backend, vocoder_threads=1)
    groups = artifact.dims.code_groups
    reqs = requests(1, frames)
    with PlanClock() as clock:
        clock.learn(synth)
        runs = []
        for _ in range(repeats + 1):
            clock.calls.clear()
            t, results = timed(synth, reqs)
            runs.append((t, dict(clock.calls), results[0].frames.shape[0]))
    synth.close()
    t, calls, steps = sorted(runs[1:], key=lambda r: r[0].wall_s)[len(runs[1:]) // 2]
    talker = np.array(calls["talker.onnx"][1:])  # the first call is the prefill
    passes = np.array(calls["code_predictor.onnx"]).reshape(steps, groups - 1)
    step_ms = t.generation_s * 1e3
    plans_ms = float(passes.sum(axis=1).mean()) + float(talker.mean())  # means, as step_ms is: the parts add up
    print(f"\none member, {steps} frames, middle of {repeats} runs: generation {step_ms:.1f} ms a frame, "
          f"vocoder {t.vocoder_s * 1e3:.1f} ms a frame (its own thread)\n")
    print("| part of a frame | ms | share |\n|---|---|---|")
    rows = [("talker decode (1 call)", float(talker.mean())),
            (f"code predictor, {groups - 1} passes", float(passes.sum(axis=1).mean())),
            ("  pass 1 (2 rows: hidden and code 0)", float(passes[:, 0].mean())),
            (f"  passes 2..{groups - 1}, each", float(passes[:, 1:].mean())),
            ("host: sampling inputs, gathers, sums, copies", step_ms - plans_ms)]
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {100 * ms / step_ms:.0f} % |")
    print(f"| generation, the stage's step_ms | {step_ms:.2f} | 100 % |")


def by_operator(art: Path) -> None:
    for graph, (dims, position) in PROFILED.items():
        nodes = profiled(art / graph, 1, step_feed(art / graph, {**dims, "B": 1}, position), runs=20)
        total = sum(ms for _, _, ms in nodes)
        by_op, count = Counter(), Counter()
        for _, op, ms in nodes:
            by_op[op] += ms
            count[op] += 1
        print(f"\n{graph}, one member's call profiled: {total:.2f} ms in {len(nodes)} kernels\n")
        print("| operator | ms | nodes | share |\n|---|---|---|---|")
        for op, ms in by_op.most_common(8):
            print(f"| {op} | {ms:.3f} | {count[op]} | {100 * ms / total:.1f} % |")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=3)
    p.add_argument("--weights", default="int4", choices=["fp32", "int8", "int4"])
    p.add_argument("--frames", type=int, default=48)
    args = p.parse_args(argv)
    case = real_case(args.work)
    art, notes = variant(case, args.weights)
    print("\n".join([*case.notes, *notes]), flush=True)
    frame_parts(art, args.frames, args.repeats)
    by_operator(art)
    return 0


if __name__ == "__main__":
    sys.exit(main())
