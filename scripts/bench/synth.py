#!/usr/bin/env python3
"""Benchmark `edged synth` against the bare engine loop and against qwen-tts, on the same weights.

    python scripts/bench/synth.py [--only tiny real omni-tiny omni-real] [--weights fp32 int8 int4]
        [--vocoder fp32|int8] [--agreeable] [--verify W] [--frames N] [--threads generation=1,vocoder=1 ...]
        [--batch 1 4] [--work DIR]

For each checkpoint (Qwen3-TTS: the tiny random one, and a random one with the real
Qwen3-TTS-12Hz-0.6B sizes; Qwen3-Omni: a tiny one, and a random one with the real Qwen3-Omni-30B-A3B
talker widths and 6 of its 20 talker layers, engines/qwen3_omni/tiny.py REAL_LAYERS), with each of
`--weights` (int8 / int4: quantized from the fp32 artifact by engines.quantize), or with
`--agreeable` its engines.agreeable twin (greedy, every speculative draft is right: measure it with
`--verify 4`), greedy, a fixed number of frames, after a warm-up, median of `--repeats` runs,
per thread plan (`--threads`, as [daemon.threads]) and batch size:

1. edged: `Synthesizer.synthesize`, the step core under the scheduler, end to end (prefill, talker,
   code predictor, vocoder windows), with the plan: the vocoder on a thread of its own, decoding a
   step's windows while the next step computes;
2. edged inline: the same with the vocoder after each step on generation's thread (vocoder=0: no
   overlap, as before the vocoder had a thread);
3. bare: the core's own plans and kernels run back to back with no bookkeeping (common.BareLoop, the
   vocoder inline) -- edged inline's overhead is the ratio of the two;
4. reference (fp32, not agreeable): qwen-tts `generate_custom_voice` on the checkpoint (talker +
   vocoder decode; no streaming, so its first audio is its total time), with as many torch threads
   as the plan has engine threads; for Qwen3-Omni, transformers' talker generation from the same
   prompt and its code2wav (engines/qwen3_omni/reference.py).

Metrics: frames/s (every member of the cohort), real-time factor (wall seconds / audio seconds of
one stream), time to first frame, time to first audio (first PCM window), and per step (one frame of
each member) the generation time (talker and code predictor) and the vocoder's (its windows, on
whichever thread decodes them): inline a step costs their sum, overlapped about their maximum.
"others' CPU" is the share of the machine's CPU time other processes took during the runs (a
busy machine slows the overlap first: it needs a free core). Bare's clock starts at its prefill
(its prompt rows are built untimed), so edged's first-frame lead also counts tokenizing and laying
out the prompt. Checkpoints and artifacts are cached in `--work`: the real-dims checkpoint is
~4.3 GB (~40 s to build), its artifact ~3.3 GB (~5 min and ~11 GB of RAM to export on 2 cores).
Needs the `export` extra.
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
from dataclasses import replace
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
    CpuWatch,
    Row,
    Run,
    load,
    machine,
    prepare_case,
    print_table,
    requests,
    variant,
    wait_quiet,
)

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.bench import timed
from edged.config import ThreadPlan
from edged.request import SpeechRequest
from edged.synth import Synthesizer

QUIET_S = 0.0
"""--quiet: the longest wait before each timed run for other processes to leave the CPU alone."""


def run_edged(synth: Synthesizer, reqs: list[SpeechRequest]) -> tuple[Run, list]:
    wait_quiet(QUIET_S)
    watch = CpuWatch()
    t, results = timed(synth, reqs)
    return Run(t.wall_s, t.frames, t.first_frame_s, t.first_audio_s, t.generation_s, t.vocoder_s,
               watch.others()), results


def run_bare(bare: BareLoop, reqs: list[SpeechRequest], frames: int) -> Run:
    bare.setup(reqs)
    wait_quiet(QUIET_S)
    watch = CpuWatch()
    run = bare.run(frames)
    run.others = watch.others()
    return run


def label(plan: ThreadPlan) -> str:
    """generation+vocoder threads (0 vocoder threads: inline)."""
    return f"{plan.generation}+{plan.vocoder}"


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


def bench_case(case: Case, plans: list[ThreadPlan], repeats: int, batches: list[int], profile: bool,
               verify: int) -> list[Row]:
    artifact = load_artifact(case.artifact)
    frame_s = artifact.samples_per_frame / artifact.sample_rate
    out: list[Row] = []
    edged_frames: dict[str, list] = {}
    for plan in plans:
        inline_plan = ThreadPlan(plan.generation, 0, plan.clone_encoder)
        t_boot = time.perf_counter()
        inline = Synthesizer(artifact, make_backend("onnxruntime", threads=plan.generation))
        overlap = Synthesizer(artifact, make_backend("onnxruntime", threads=plan.generation),
                              vocoder_threads=plan.vocoder) if plan.vocoder else None
        case.notes.append(f"threads {plan}: Synthesizer boot {time.perf_counter() - t_boot:.1f} s, "
                          f"claimed {sum(inline.claimed.values()) / 2**20:.0f} MiB each")
        synths = [(label(inline_plan), "edged inline", inline)] + ([(label(plan), "edged", overlap)] if overlap else [])
        bare = BareLoop(inline.core)
        for batch in batches:
            reqs = requests(batch, case.frames, case.family, verify)
            for _, _, synth in synths:
                run_edged(synth, reqs)  # warm-up
            run_bare(bare, reqs, case.frames)  # warm-up
            runs: dict[str, list[Run]] = {path: [] for _, path, _ in synths}
            b_runs = []
            for _ in range(repeats):  # interleaved, so drift hits every path alike
                for _, path, synth in synths:
                    run, results = run_edged(synth, reqs)
                    runs[path].append(run)
                b_runs.append(run_bare(bare, reqs, case.frames))
            check = bare.check(results, case.frames)
            if batch == 1:
                edged_frames[label(plan)] = results
            b = Row(case.title, "bare", label(inline_plan), batch, b_runs, frame_s, check=check)
            rows = [b] + [Row(case.title, path, name, batch, runs[path], frame_s) for name, path, _ in synths]
            for row in rows[1:]:
                row.ratio = row.wall / b.wall
            out += rows
            progress(rows)
        if case.name == "omni-real":
            layers = artifact.dims.layers
            case.per_layer_ms[("edged", label(plan))] = decode_step_ms(inline) / layers
            case.notes.append(f"threads {plan}: talker decode step "
                              f"{case.per_layer_ms[('edged', label(plan))] * layers:.1f} ms at {layers} layers")
        if profile and plan == plans[0]:
            cprofile(overlap or inline, requests(1, case.frames, case.family, verify))
        for _, _, synth in synths:
            synth.close()
        del inline, overlap, synths, bare
        gc.collect()
    if case.reference:
        out += bench_reference(case, plans, repeats, frame_s, edged_frames, out)
    return out


def bench_reference(case: Case, plans: list[ThreadPlan], repeats: int, frame_s: float,
                    edged_frames: dict[str, list], rows: list[Row]) -> list[Row]:
    """qwen-tts (or transformers) on the checkpoint, with as many torch threads as each plan has engine
    threads; compared with edged's overlapped rows (its inline ones where the plan has no vocoder thread)."""
    import torch

    t_load = time.perf_counter()
    model = load_reference(case)
    case.notes.append(f"reference load {time.perf_counter() - t_load:.1f} s")
    out = []
    for plan in plans:
        t = label(plan)
        torch.set_num_threads(plan.generation + plan.vocoder)
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
        ref = Row(case.title, "reference", t, 1, runs, frame_s, check=check)
        out.append(ref)
        progress([ref])
        for row in rows:
            if row.path.startswith("edged") and row.threads in (t, label(ThreadPlan(plan.generation, 0))) \
                    and row.batch == 1:
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
    p.add_argument("--weights", choices=["fp32", "int8", "int4"], nargs="+", default=["fp32"],
                   help="fp32, or 8- / 4-bit weights quantized from it (engines.quantize)")
    p.add_argument("--block", type=int, default=None,
                   help="rows per int8 / int4 quantization block (default: engines.quantize's, 128 at the real sizes)")
    p.add_argument("--vocoder", choices=["fp32", "int8"], default="fp32",
                   help="the vocoder's form: int8 quantizes its convolutions (engines/vocoder_int8.py)")
    p.add_argument("--agreeable", action="store_true",
                   help="the checkpoints' engines.agreeable twins (Qwen3-TTS): every greedy draft right")
    p.add_argument("--verify", type=int, default=0, help="the code predictor's speculative verify window (0: off)")
    p.add_argument("--frames", type=int, default=None, help="frames per utterance (default: tiny 40, real 16)")
    p.add_argument("--threads", type=ThreadPlan.parse, nargs="+",
                   default=[ThreadPlan(1, 1), ThreadPlan(2, 1)], metavar="generation=G,vocoder=V",
                   help="thread plans (as [daemon.threads]); each is measured overlapped (vocoder on its own "
                        "thread) and inline (vocoder=0, G generation threads)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="cohort sizes for edged and bare")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (median reported)")
    p.add_argument("--max-seq", type=int, default=256, help="KV slots of the exported artifacts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench",
                   help="cache for checkpoints and artifacts")
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip qwen-tts (it runs only on fp32, not agreeable, checkpoints anyway)")
    p.add_argument("--profile", action="store_true", help="cProfile one edged run per checkpoint")
    p.add_argument("--quiet", type=float, default=0.0, metavar="S",
                   help="on a shared machine: before each timed run wait up to S seconds for other processes to "
                        "take under 10%% of the CPU for a second")
    args = p.parse_args(argv)
    global QUIET_S
    QUIET_S = args.quiet
    if args.repeats < 3:
        p.error("--repeats must be >= 3 (the median of fewer runs is not robust)")
    if any(b < 1 or b > 4 for b in args.batch):
        p.error("--batch sizes must be in 1..4 (the artifacts are exported with max_batch 4)")
    if args.agreeable and any(FAMILIES[name] != "qwen3_tts" for name in args.only or FAMILIES):
        p.error("--agreeable takes Qwen3-TTS checkpoints only (--only tiny real)")

    import torch

    torch.set_num_threads(1)
    header = machine()
    print("\n".join(header), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    rows, cases = [], []
    plans = ", ".join(map(str, args.threads))
    for name in list(FAMILIES) if args.only is None else args.only:
        frames = args.frames or (16 if name.endswith("real") else 40)
        print(f"\n== {name}: preparing", flush=True)
        base = prepare_case(name, args.work, frames, args.max_seq, args.seed)
        print("\n".join("  " + n for n in base.notes), flush=True)
        for weights in args.weights:
            block = None if weights == "fp32" else args.block
            art, notes = variant(base, weights, args.agreeable, block, args.vocoder)
            print("\n".join("  " + n for n in notes), flush=True)
            case = replace(base, artifact=art, weights=weights, block=block, agreeable=args.agreeable, notes=[],
                           per_layer_ms={}, vocoder=args.vocoder,
                           reference=args.reference and weights == "fp32" and not args.agreeable
                           and args.vocoder == "fp32")
            print(f"== {case.title}: {frames} frames, verify {args.verify or 'off'}, threads {plans}, batches "
                  f"{args.batch}, {args.repeats} repeats", flush=True)
            rows += bench_case(case, args.threads, args.repeats, args.batch, args.profile, args.verify)
            cases.append(case)
    print("\n" + "\n".join(header) + f"\nat the end, {load()}")
    for case in cases:
        print(f"{case.title}: " + "; ".join(case.notes))
        if case.name == "omni-real" and case.reference:
            layers = load_artifact(case.artifact).dims.layers
            print("\n".join(projection(case, [r for r in rows if r.model == case.title], layers)))
    print()
    print_table(rows)
    print("\nRTF = median wall / audio of one stream (80 ms per frame); frames/s counts every member of "
          "the cohort; thr = generation+vocoder engine threads (vocoder 0: inline, after each step), torch "
          "threads for the reference; gen / voc ms/step: per step (a frame of each member), the talker and code "
          "predictor / the vocoder's windows; spread = (max - min) / median of the timed runs; check: bare's "
          "frames and PCM against edged's, the reference's against edged's.")
    print("\n" + "\n".join(summary(rows)))
    return 0


def summary(rows: list[Row]) -> list[str]:
    """Per checkpoint and plan: RTF overlapped and inline, and the cohort's frames/s at the largest batch
    over batch 1's."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        for r in rows:
            if r.model != model or r.path != "edged":
                continue
            inline = next(x for x in rows if x.model == model and x.path == "edged inline" and x.batch == r.batch
                          and x.threads == f"{r.threads.split('+')[0]}+0")
            one = next((x for x in rows if x.model == model and x.path == r.path and x.threads == r.threads
                        and x.batch == 1), None)
            scale = f", frames/s {r.fps / one.fps:.2f}x batch 1's" if one is not None and r.batch > 1 else ""
            lines.append(f"{model} {r.threads} batch {r.batch}: RTF {r.rtf:.3f} overlapped, {inline.rtf:.3f} inline "
                         f"({inline.threads}){scale}; first audio {r.median_of('first_audio_s') * 1e3:.0f} ms "
                         f"overlapped, {inline.median_of('first_audio_s') * 1e3:.0f} ms inline")
    return lines


if __name__ == "__main__":
    sys.exit(main())
