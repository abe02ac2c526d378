#!/usr/bin/env python3
"""fp32 vs 8- and 4-bit weights, each without and with the code predictor's speculative verify, at the
real Qwen3-TTS-12Hz-0.6B dimensions, side by side in one run.

    python scripts/bench/weights.py [--threads 2] [--frames 16] [--window 4] [--work DIR]

Two checkpoints of the real dimensions: the random one scripts/bench/synth.py caches in `--work`
(its later heads' drafts are almost never right: speculation's cost at acceptance 0), and its
`engines.agreeable` twin (same shapes and bytes; greedy, every draft is right: speculation at
acceptance 1). Their fp32 artifacts are exported, the int8 and int4 ones quantized from them
(`engines.quantize`), all cached beside each other. Each artifact and window is measured in a fresh
process (so resident memory is its own): boot a `Synthesizer`, warm up, then the median of
`--repeats` greedy runs of `--frames` frames (RTF, the code predictor's passes and accepted drafts),
each stage's ms per frame (scripts/roofline.py: the talker's decode, one frame of code-predictor
passes, one vocoder window) and the process's resident memory. Printed with the artifact's size on
disk, the bytes each stage reads per frame and its time as a multiple of its roofline (this
machine's bandwidth, measured once in the parent).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, parser, prepare_case, requests, variant
from roofline import BITS, bandwidth, stage_bytes, stage_times

WEIGHTS = ("fp32", "int8", "int4")


def measure(artifact: Path, threads: int, frames: int, repeats: int, window: int) -> dict:
    """In this process: RTF, stage ms per frame, resident memory, the code predictor's passes, drafts
    and accepted drafts per frame."""
    from edged.artifact import load_artifact
    from edged.backends import make_backend
    from edged.synth import Synthesizer

    a = load_artifact(artifact)
    synth = Synthesizer(a, make_backend("onnxruntime", threads=threads))
    reqs = requests(1, frames, a.family, window)
    synth.synthesize(reqs)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = synth.synthesize(reqs)[0]
        walls.append(time.perf_counter() - t0)
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    del synth
    stages = stage_times(a, threads, repeats, 4, window=window)
    walls.sort()
    n = result.frames.shape[0]
    talker = result.report["stages"][0]
    return {"rtf": walls[len(walls) // 2] / (n * a.frame_ms / 1e3), "stages": {k: v * 1e3 for k, v in stages.items()},
            "rss": rss, "passes": talker["cp_passes"] / n, "drafted": talker["cp_drafted"] / n,
            "accepted": talker["cp_accepted"] / n}


def weight_bytes_held(path: Path) -> int:
    """The bytes of every weight an artifact holds: its graphs' initializers and its host tables."""
    import numpy as np
    import onnx

    total = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    for graph in path.glob("*.onnx"):
        for init in onnx.load(str(graph), load_external_data=False).graph.initializer:
            total += int(np.prod(init.dims)) * BITS.get(init.data_type, 32) // 8
    return total


def artifacts(work: Path, frames: int, max_seq: int) -> dict[tuple[str, str], Path]:
    """(checkpoint, weights) -> its artifact, made or taken from the cache."""
    case = prepare_case("real", work, frames, max_seq, 0)
    paths = {}
    for name in ("random", "agreeable"):
        for w in WEIGHTS:
            paths[name, w], notes = variant(case, w, agreeable=name == "agreeable")
            print("\n".join(notes), flush=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--window", type=int, default=4, help="the speculative verify window of the verify rows")
    p.add_argument("--max-seq", type=int, default=256)
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.threads, args.frames, args.repeats, args.window)))
        return 0
    from edged.artifact import load_artifact

    print("\n".join(machine()), flush=True)
    paths = artifacts(args.work, args.frames, args.max_seq)
    gemv, _ = bandwidth(args.threads)
    print(f"bandwidth: {gemv:.1f} GB/s (ONNX Runtime streaming fp32 weights, {args.threads} threads)\n", flush=True)
    print("| checkpoint | weights | verify | weights held GiB | artifact GiB | resident GiB | RTF | talker ms (x roofline) "
          "| code predictor ms (x roofline) | vocoder ms (x roofline) | MB read / frame | passes / frame "
          "| drafts accepted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, w), path in paths.items():
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        held = weight_bytes_held(path)
        for window in (0, args.window):
            out = subprocess.run([sys.executable, __file__, "--measure", str(path), "--threads", str(args.threads),
                                  "--frames", str(args.frames), "--repeats", str(args.repeats), "--window", str(window)],
                                 check=True, capture_output=True, text=True).stdout
            m = json.loads(out.strip().splitlines()[-1])
            nbytes = stage_bytes(load_artifact(path), 64, 4, m["passes"], m["passes"] + 2 * m["drafted"])
            cells = [f"{m['stages'][s]:.1f} ({m['stages'][s] / 1e3 / (nbytes[s] / (gemv * 1e9)):.2f})"
                     for s in ("talker decode", "code predictor", "vocoder")]
            accepted = f"{m['accepted'] / m['drafted']:.2f}" if m["drafted"] else "-"
            gib = " | ".join(f"{x / 2**30:.2f}" for x in (held, size, m["rss"]))
            tail = f"{sum(nbytes.values()) / 1e6:.0f} | {m['passes']:.1f} | {accepted}"
            print(f"| {name} | {w} | {window or 'off'} | {gib} | {m['rtf']:.3f} | " + " | ".join(cells) + f" | {tail} |",
                  flush=True)
    print(f"\nbatch 1, greedy, {args.frames} frames; stage times are each stage's plans alone (talker decode at "
          f"KV position 64, code predictor = one frame of passes, vocoder = a 4-frame window / 4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
