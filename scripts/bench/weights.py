#!/usr/bin/env python3
"""fp32 vs 8- and 4-bit weights at the real Qwen3-TTS-12Hz-0.6B dimensions, side by side in one run.

    python scripts/bench/weights.py [--threads 2] [--frames 16] [--work DIR]

The real-dims random checkpoint and its fp32 artifact are the ones scripts/bench/synth.py caches
in `--work`; the int8 and int4 artifacts are made from the fp32 one (`engines.quantize`) and cached
beside it. Each artifact is measured in a fresh process (so resident memory is its own): boot a
`Synthesizer`, warm up, then the median of `--repeats` greedy runs of `--frames` frames (RTF), each
stage's ms per frame (scripts/roofline.py: the talker's decode, one frame of code-predictor passes,
one vocoder window) and the process's resident memory. Printed with the artifact's size on disk,
the bytes each stage reads per frame and its time as a multiple of its roofline (this machine's
bandwidth, measured once in the parent).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, prepare_case, requests
from roofline import bandwidth, stage_bytes, stage_times

WEIGHTS = ("fp32", "int8", "int4")


def measure(artifact: Path, threads: int, frames: int, repeats: int) -> dict:
    """In this process: RTF, stage ms per frame, resident memory."""
    from edged.artifact import load_artifact
    from edged.backends import make_backend
    from edged.synth import Synthesizer

    a = load_artifact(artifact)
    synth = Synthesizer(a, make_backend("onnxruntime", threads=threads))
    reqs = requests(1, frames, a.family)
    synth.synthesize(reqs)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = synth.synthesize(reqs)[0]
        walls.append(time.perf_counter() - t0)
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    del synth
    stages = stage_times(a, threads, repeats, 4)
    walls.sort()
    audio_s = result.frames.shape[0] * a.frame_ms / 1e3
    return {"rtf": walls[len(walls) // 2] / audio_s, "stages": {k: v * 1e3 for k, v in stages.items()}, "rss": rss}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seq", type=int, default=256)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench")
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.threads, args.frames, args.repeats)))
        return 0
    from edged.artifact import load_artifact
    from engines.quantize import quantize_artifact

    header = machine()
    print("\n".join(header), flush=True)
    case = prepare_case("real", args.work, args.frames, args.max_seq, 0)
    paths = {"fp32": case.artifact}
    for w in WEIGHTS[1:]:
        paths[w] = case.artifact.with_name(f"{case.artifact.name}-{w}")
        if not (paths[w] / "artifact.json").is_file():
            quantize_artifact(case.artifact, paths[w], w)
    gemv, _ = bandwidth(args.threads)
    print(f"bandwidth: {gemv:.1f} GB/s (ONNX Runtime streaming fp32 weights, {args.threads} threads)\n", flush=True)
    print("| weights | artifact GiB | resident GiB | RTF | talker ms (x roofline) | code predictor ms (x roofline) "
          "| vocoder ms (x roofline) | MB read / frame |")
    print("|---|---|---|---|---|---|---|---|")
    for w in WEIGHTS:
        out = subprocess.run([sys.executable, __file__, "--measure", str(paths[w]), "--threads", str(args.threads),
                              "--frames", str(args.frames), "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True).stdout
        m = json.loads(out.strip().splitlines()[-1])
        nbytes = stage_bytes(load_artifact(paths[w]), 64, 4)
        size = sum(f.stat().st_size for f in paths[w].iterdir() if f.is_file())
        cells = [f"{m['stages'][s]:.1f} ({m['stages'][s] / 1e3 / (nbytes[s] / (gemv * 1e9)):.2f})"
                 for s in ("talker decode", "code predictor", "vocoder")]
        print(f"| {w} | {size / 2**30:.2f} | {m['rss'] / 2**30:.2f} | {m['rtf']:.3f} | " + " | ".join(cells)
              + f" | {sum(nbytes.values()) / 1e6:.0f} |", flush=True)
    print(f"\nbatch 1, greedy, {args.frames} frames; stage times are each stage's plans alone (talker decode at "
          f"KV position 64 bytes, code predictor = its G-1 passes, vocoder = a 4-frame window / 4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
