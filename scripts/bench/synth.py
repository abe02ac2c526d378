#!/usr/bin/env python3
"""Benchmark `edged synth` against the bare engine loop and against qwen-tts, on the same weights.

    python scripts/bench/synth.py [--only tiny real omni-tiny omni-real] [--frames N] [--threads 1 2] [--work DIR]

For each checkpoint (Qwen3-TTS: the tiny random one, and a random one with the real
Qwen3-TTS-12Hz-0.6B sizes; Qwen3-Omni: a tiny one, and a random one with the real Qwen3-Omni-30B-A3B
talker widths and 6 of its 20 talker layers, engines/qwen3_omni/tiny.py REAL_LAYERS), greedy, a
fixed number of frames, after a warm-up, median of `--repeats` runs:

1. edged: `Synthesizer.synthesize`, the step core under the scheduler, end to end (prefill, talker,
   code predictor, vocoder windows);
2. bare: the core's own plans and kernels run back to back with no bookkeeping (common.BareLoop) --
   edged's overhead is the ratio of the two;
3. reference: qwen-tts `generate_custom_voice` on the checkpoint (talker + vocoder decode; no
   streaming, so its first audio is its total time); for Qwen3-Omni, transformers' talker
   generation from the same prompt and its code2wav (engines/qwen3_omni/reference.py).

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

from common import (
    FAMILIES,
    LANGUAGE,
    OMNI_SPEAKER,
    SPEAKER,
    TEXTS,
    BareLoop,
    Case,
    Row,
    Run,
    load,
    machine,
    prepare_case,
    print_table,
    requests,
)

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


def run_reference(case: Case, model, text: str, frames: int) -> tuple[Run, np.ndarray, np.ndarray]:
    t0 = time.perf_counter()
    if case.family == "qwen3_omni":
        from engines.qwen3_omni import reference

        # the token that ends the library's generation gets no frame: one more token for `frames` frames
        codes, pcm = reference.generate(model, case.checkpoint / "tokenizer.json", text, (), OMNI_SPEAKER,
                                        max_new_tokens=frames + 1)
    else:
        from engines.qwen3_tts.reference import reference_synthesize

        codes, pcm = reference_synthesize(model, text, speaker=SPEAKER, language=LANGUAGE, max_frames=frames,
                                          greedy=True)
    wall = time.perf_counter() - t0
    return Run(wall, codes.shape[0], None, wall), codes, pcm


def load_reference(case: Case):
    if case.family == "qwen3_omni":
        from transformers import Qwen3OmniMoeForConditionalGeneration

        return Qwen3OmniMoeForConditionalGeneration.from_pretrained(case.checkpoint).eval()
    from engines.qwen3_tts.reference import load_reference as load_tts

    return load_tts(case.checkpoint)


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
            reqs = requests(batch, case.frames, case.family)
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
        if case.name == "omni-real":
            layers = artifact.dims.layers
            case.per_layer_ms[("edged", t)] = decode_step_ms(synth) / layers
            case.notes.append(f"threads={t}: talker decode step {case.per_layer_ms[('edged', t)] * layers:.1f} ms "
                              f"at {layers} layers")
        if profile and t == threads[0]:
            cprofile(synth, requests(1, case.frames, case.family))
        del synth, bare
        gc.collect()
    out += bench_reference(case, threads, repeats, frame_s, edged_frames, out)
    return out


def bench_reference(case: Case, threads: list[int], repeats: int, frame_s: float,
                    edged_frames: dict[int, list], rows: list[Row]) -> list[Row]:
    import torch

    t_load = time.perf_counter()
    model = load_reference(case)
    case.notes.append(f"reference load {time.perf_counter() - t_load:.1f} s")
    out = []
    for t in threads:
        torch.set_num_threads(t)
        run_reference(case, model, TEXTS[0], case.frames)  # warm-up
        runs = []
        for _ in range(repeats):
            run, codes, pcm = run_reference(case, model, TEXTS[0], case.frames)
            runs.append(run)
        check = "no batch-1 edged run to compare"
        if t in edged_frames:
            edged = edged_frames[t][0]
            same = codes.shape == edged.frames.shape and np.array_equal(codes, edged.frames)
            err = np.abs(pcm - edged.pcm).max() if pcm.shape == edged.pcm.shape else float("nan")
            check = f"frames {'=' if same else '!='} edged, pcm max err {err:.1e}"
        if case.name == "omni-real":
            case.per_layer_ms[("reference", t)] = reference_layer_ms(case, model, runs)
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


def decode_step_ms(synth: Synthesizer, steps: int = 20) -> float:
    """The talker's one-row decode plan over the whole cache alone, median ms (it reads the same layers
    whatever the cache holds)."""
    plan = synth.core.talker.decode_plans[0][synth.core.talker.buckets[-1]]
    plan.run()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        plan.run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def reference_layer_ms(case: Case, model, full: list[Run]) -> float:
    """The reference's cost of one talker layer per frame: the same generation with half the talker's
    layers, the difference per frame divided by the layers left out."""
    layers = model.talker.model.layers
    keep = len(layers) // 2
    model.talker.model.layers = layers[:keep]
    try:
        half = [run_reference(case, model, TEXTS[0], case.frames)[0] for _ in range(3)]
    finally:
        model.talker.model.layers = layers
    per_frame = lambda runs: float(np.median([r.wall_s / r.frames for r in runs]))  # noqa: E731
    return (per_frame(full) - per_frame(half)) * 1e3 / (len(layers) - keep)


def projection(case: Case, rows: list[Row], layers: int, target: int = 20) -> list[str]:
    """Per-frame ms of edged (batch 1) and the reference, measured and projected to `target` talker
    layers by each one's measured per-layer cost."""
    lines = []
    for t in sorted({r.threads for r in rows}):
        frame = {r.path: r.wall / (r.frames / r.batch) * 1e3 for r in rows if r.threads == t and r.batch == 1}
        if "edged" not in frame or "reference" not in frame:
            continue
        proj = {p: frame[p] + (target - layers) * case.per_layer_ms[(p, t)] for p in ("edged", "reference")}
        lines.append(f"threads={t}: per frame at {layers} layers edged {frame['edged']:.1f} ms, reference "
                     f"{frame['reference']:.1f} ms (edged/ref {frame['edged'] / frame['reference']:.3f}); per talker "
                     f"layer edged {case.per_layer_ms[('edged', t)]:.2f} ms, reference "
                     f"{case.per_layer_ms[('reference', t)]:.2f} ms; projected to {target} layers edged "
                     f"{proj['edged']:.1f} ms (RTF {proj['edged'] / 80:.2f}), reference {proj['reference']:.1f} ms "
                     f"(RTF {proj['reference'] / 80:.2f}), edged/ref {proj['edged'] / proj['reference']:.3f}")
    return lines


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
    p.add_argument("--only", choices=list(FAMILIES), nargs="+", default=None, help="these checkpoints only")
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
    for name in list(FAMILIES) if args.only is None else args.only:
        frames = args.frames or (16 if name.endswith("real") else 40)
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
        if case.name == "omni-real":
            layers = load_artifact(case.artifact).dims.layers
            print("\n".join(projection(case, [r for r in rows if r.model == case.name], layers)))
    print()
    print_table(rows)
    print("\nRTF = median wall / audio of one stream (80 ms per frame); frames/s counts every member of "
          "the cohort; spread = (max - min) / median of the timed runs; check: bare's frames and PCM against "
          "edged's, the reference's against edged's.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
