#!/usr/bin/env python3
"""Benchmark `edged synth` against the bare engine loop and against qwen-tts, on the same weights.

    python scripts/bench/synth.py [--only tiny|real] [--frames N] [--threads 1 2] [--work DIR]

For each checkpoint (the tiny random one, and a random one with the real Qwen3-TTS-12Hz-0.6B
sizes), greedy, a fixed number of frames, after a warm-up, median of `--repeats` runs:

1. edged: `Synthesizer.synthesize`, the step core under the scheduler, end to end (prefill, talker,
   code predictor, vocoder windows);
2. bare: the core's own plans and kernels run back to back with no bookkeeping (common.BareLoop) --
   edged's overhead is the ratio of the two;
3. reference: qwen-tts `generate_custom_voice` on the checkpoint (talker + vocoder decode; no
   streaming, so its first audio is its total time).

Metrics: frames/s, real-time factor (wall seconds / audio seconds), time to first frame, time to
first audio (first PCM window). Bare's clock starts at its prefill (its prompt rows are built
untimed), so edged's first-frame lead also counts tokenizing and laying out the prompt. Checkpoints
and artifacts are cached in `--work`: the real-dims checkpoint is ~4.3 GB (~40 s to build), its
artifact ~5.9 GB (~12 min and ~11 GB of RAM to export on 2 cores). Needs the `export` extra.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # an idle OpenMP thread stalls small matmuls
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LANGUAGE, SPEAKER, TEXTS, BareLoop, Case, Row, Run, load, machine, prepare_case, print_table, requests

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.request import SpeechRequest
from edged.synth import Synthesizer


def run_edged(synth: Synthesizer, reqs: list[SpeechRequest]) -> tuple[Run, list]:
    t0 = time.perf_counter()
    results = synth.synthesize(reqs)
    wall = time.perf_counter() - t0
    first = results[0].report  # the first request starts with the run
    return Run(wall, sum(r.frames.shape[0] for r in results), first["first_frame_ms"] / 1e3,
               first["first_audio_ms"] / 1e3), results


def run_reference(model, text: str, frames: int) -> tuple[Run, np.ndarray, np.ndarray]:
    from engines.qwen3_tts.reference import reference_synthesize

    t0 = time.perf_counter()
    codes, pcm = reference_synthesize(model, text, speaker=SPEAKER, language=LANGUAGE, max_frames=frames, greedy=True)
    wall = time.perf_counter() - t0
    return Run(wall, codes.shape[0], None, wall), codes, pcm


def bench_case(case: Case, threads: list[int], repeats: int, batches: list[int], profile: bool) -> list[Row]:
    artifact = load_artifact(case.artifact)
    frame_s = artifact.samples_per_frame / artifact.sample_rate
    out: list[Row] = []
    edged_frames: dict[int, list] = {}
    for t in threads:
        t_boot = time.perf_counter()
        synth = Synthesizer(artifact, make_backend("onnxruntime", threads=t))
        case.notes.append(f"threads={t}: Synthesizer boot {time.perf_counter() - t_boot:.1f} s, "
                          f"claimed {sum(synth.claimed.values()) / 2**20:.0f} MiB")
        bare = BareLoop(synth.core)
        for batch in batches:
            reqs = requests(batch, case.frames)
            run_edged(synth, reqs)  # warm-up
            bare.setup(reqs)
            bare.run(case.frames)  # warm-up
            e_runs, b_runs = [], []
            for _ in range(repeats):  # interleaved, so drift hits both alike
                run, results = run_edged(synth, reqs)
                e_runs.append(run)
                bare.setup(reqs)
                b_runs.append(bare.run(case.frames))
            check = bare.check(results, case.frames)
            if batch == 1:
                edged_frames[t] = results
            e = Row(case.name, "edged", t, batch, e_runs, frame_s)
            b = Row(case.name, "bare", t, batch, b_runs, frame_s, check=check)
            e.ratio = e.wall / b.wall
            out += [b, e]
            progress(out[-2:])
        if profile and t == threads[0]:
            cprofile(synth, requests(1, case.frames))
        del synth, bare
        gc.collect()
    out += bench_reference(case, threads, repeats, frame_s, edged_frames, out)
    return out


def bench_reference(case: Case, threads: list[int], repeats: int, frame_s: float,
                    edged_frames: dict[int, list], rows: list[Row]) -> list[Row]:
    import torch

    from engines.qwen3_tts.reference import load_reference

    t_load = time.perf_counter()
    model = load_reference(case.checkpoint)
    case.notes.append(f"reference load {time.perf_counter() - t_load:.1f} s")
    out = []
    for t in threads:
        torch.set_num_threads(t)
        run_reference(model, TEXTS[0], case.frames)  # warm-up
        runs = []
        for _ in range(repeats):
            run, codes, pcm = run_reference(model, TEXTS[0], case.frames)
            runs.append(run)
        check = "no batch-1 edged run to compare"
        if t in edged_frames:
            edged = edged_frames[t][0]
            same = codes.shape == edged.frames.shape and np.array_equal(codes, edged.frames)
            err = np.abs(pcm - edged.pcm).max() if pcm.shape == edged.pcm.shape else float("nan")
            check = f"frames {'=' if same else '!='} edged, pcm max err {err:.1e}"
        ref = Row(case.name, "reference", t, 1, runs, frame_s, check=check)
        out.append(ref)
        progress([ref])
        for row in rows:
            if row.path == "edged" and row.threads == t and row.batch == 1:
                row.vs_reference = row.wall / ref.wall
    torch.set_num_threads(1)
    del model
    gc.collect()
    return out


def cprofile(synth: Synthesizer, reqs: list[SpeechRequest]) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    synth.synthesize(reqs)
    prof.disable()
    print("\n-- cProfile of one edged run (top 15 by own time) --")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def progress(rows: list[Row]) -> None:
    for r in rows:
        print(f"  [{r.model} t={r.threads} b={r.batch}] {r.path}: {r.wall * 1e3:.1f} ms median "
              f"({', '.join(f'{x.wall_s * 1e3:.1f}' for x in r.runs)})", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["tiny", "real"], default=None, help="one checkpoint only")
    p.add_argument("--frames", type=int, default=None, help="frames per utterance (default: tiny 40, real 16)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="ORT intra-op (and torch) threads")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="cohort sizes for edged and bare")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (median reported)")
    p.add_argument("--max-seq", type=int, default=256, help="KV slots of the exported artifacts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench",
                   help="cache for checkpoints and artifacts")
    p.add_argument("--profile", action="store_true", help="cProfile one edged run per checkpoint")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error("--repeats must be >= 3 (the median of fewer runs is not robust)")
    if any(b < 1 or b > 4 for b in args.batch):
        p.error("--batch sizes must be in 1..4 (the artifacts are exported with max_batch 4)")

    import torch

    torch.set_num_threads(1)
    header = machine()
    print("\n".join(header), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    rows, cases = [], []
    for name in ["tiny", "real"] if args.only is None else [args.only]:
        frames = args.frames or {"tiny": 40, "real": 16}[name]
        print(f"\n== {name}: preparing", flush=True)
        case = prepare_case(name, args.work, frames, args.max_seq, args.seed)
        print("\n".join("  " + n for n in case.notes), flush=True)
        case.notes.clear()
        print(f"== {name}: {frames} frames, threads {args.threads}, batches {args.batch}, "
              f"{args.repeats} repeats", flush=True)
        rows += bench_case(case, args.threads, args.repeats, args.batch, args.profile)
        cases.append(case)
    print("\n" + "\n".join(header) + f"\nat the end, {load()}")
    for case in cases:
        print(f"{case.name}: " + "; ".join(case.notes))
    print()
    print_table(rows)
    print("\nRTF = median wall / audio of one stream (80 ms per frame); frames/s counts every member of "
          "the cohort; spread = (max - min) / median of the timed runs; check: bare's frames and PCM against "
          "edged's, the reference's against edged's.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
