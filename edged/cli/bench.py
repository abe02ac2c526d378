"""`edged bench`: the offline cohort's speed on this machine, on an artifact, at each cohort size."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from edged.artifact import Artifact, ArtifactError, load_artifact
from edged.backends import EngineError
from edged.bench import Timed, requests, timed
from edged.cli.synth import offline_backend, thread_plan
from edged.config import ThreadPlan
from edged.cpu import this_cpu
from edged.request import SamplingError
from edged.synth import RequestError, Synthesizer
from edged.vocoder.form import VocoderForm, choose_vocoder

EXIT_BAD_INPUT = 2


def add_parser(commands) -> None:
    p = commands.add_parser("bench", help="time the offline cohort on an artifact: RTF, frames/s, first audio, "
                                          "generation and vocoder per step, at each batch")
    p.add_argument("--artifact", type=Path, default=None, help="artifact directory (default: the built-in tiny one)")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="cohort sizes to time (default: 1 and the artifact's max_batch)")
    p.add_argument("--frames", type=int, default=48, help="frames per member (default: 48)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per batch after one warm-up (default: 3)")
    p.add_argument("--verify", type=int, default=0, metavar="W",
                   help="the code predictor's speculative verify window: 0 = off (default), 2..8")
    p.add_argument("--voice", default=None, help="a speaker of the artifact (default: the model's default)")
    p.add_argument("--language", default=None, help="a language of the artifact (default: auto)")
    p.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "tensorrt"])
    p.add_argument("--threads", type=thread_plan, default=ThreadPlan(), metavar="STAGE=N[,STAGE=N...]",
                   help="engine threads per stage, as [daemon.threads] (default: generation=1,vocoder=1)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        artifact = load_artifact(args.artifact)
        batches = args.batch or sorted({1, artifact.max_batch})
        if args.frames < 1 or args.repeats < 1:
            raise RequestError("--frames and --repeats must be >= 1")
        if any(not 1 <= b <= artifact.max_batch for b in batches):
            raise RequestError(f"--batch must be in 1..{artifact.max_batch} (the artifact's max_batch)")
        plan: ThreadPlan = args.threads
        backend = offline_backend(args.backend, plan.generation)
        print(machine(args, artifact, choose_vocoder(artifact, backend.name)), flush=True)
        print("\n| batch | RTF | frames/s | x batch 1 | gen ms/step | voc ms/step | first audio ms | spread |\n"
              "|---|---|---|---|---|---|---|---|", flush=True)
        try:
            synth = Synthesizer(artifact, backend, vocoder_threads=plan.vocoder)
            try:
                single = None
                for batch in batches:
                    reqs = requests(batch, args.frames, args.voice, args.language, args.verify)
                    timed(synth, reqs)  # warm-up
                    runs = sorted((timed(synth, reqs)[0] for _ in range(args.repeats)), key=lambda t: t.wall_s)
                    median = runs[len(runs) // 2]  # the middle run by wall time, with its own per-step figures
                    single = single or (median.frames_per_s if batch == 1 else None)
                    print(row(batch, median, runs, single, artifact.samples_per_frame / artifact.sample_rate),
                          flush=True)
            finally:
                synth.close()
        finally:
            backend.close()
    except (ArtifactError, EngineError, RequestError, SamplingError) as exc:
        print(f"edged bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def row(batch: int, t: Timed, runs: list[Timed], single: float | None, frame_s: float) -> str:
    spread = (runs[-1].wall_s - runs[0].wall_s) / t.wall_s
    ratio = f"{t.frames_per_s / single:.2f}" if single else "-"
    first = f"{t.first_audio_s * 1e3:.0f}" if t.first_audio_s is not None else "-"
    return (f"| {batch} | {t.rtf(frame_s):.3f} | {t.frames_per_s:.2f} | {ratio} | {t.generation_s * 1e3:.1f} | "
            f"{t.vocoder_s * 1e3:.1f} | {first} | {100 * spread:.0f}% |")


def machine(args: argparse.Namespace, artifact: Artifact, vocoder: VocoderForm) -> str:
    """Three lines: the artifact and the form each stage runs, the CPU as the kernels see it, and the
    backend, the plan and the run's shape."""
    import onnxruntime

    plan = args.threads
    weights = "fp32" if artifact.weights == "fp32" else f"{artifact.weights} for {artifact.weight_target}"
    return (f"edged bench: {artifact.path}: talker and code predictor {artifact.precision} network, {weights} weights; "
            f"{vocoder.line()}\n"
            f"cpu: {this_cpu().line()}, {os.cpu_count()} logical cores\n"
            f"backend {args.backend}, onnxruntime {onnxruntime.__version__}, threads generation={plan.generation},"
            f"vocoder={plan.vocoder}; {args.frames} greedy frames a member, verify {args.verify}, median of "
            f"{args.repeats} after a warm-up")
