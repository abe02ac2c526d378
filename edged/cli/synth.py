"""`edged synth`: offline synthesis of one text to a WAV file (and optionally its codec frames)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edged.artifact import ArtifactError, load_artifact
from edged.audio.wav import read_wav, write_wav
from edged.backends import Backend, EngineError, make_backend
from edged.clone import BadReference, VoiceEncoder, reference_pcm
from edged.clone.reference import MAX_REFERENCE_MS, MIN_REFERENCE_MS
from edged.config import ConfigError, ThreadPlan
from edged.request import ClonedVoice, Sampling, SamplingError, SpeechRequest
from edged.synth import RequestError, Synthesizer

EXIT_BAD_INPUT = 2


def add_parser(commands) -> None:
    p = commands.add_parser("synth", help="synthesize TEXT to a WAV file")
    p.add_argument("--artifact", type=Path, default=None, help="artifact directory (default: the built-in tiny one)")
    p.add_argument("--text", required=True, help="the text to speak (on a Qwen3-Omni artifact: the assistant reply)")
    p.add_argument("--user-text", action="append", default=[], metavar="TEXT",
                   help="an earlier user turn, as the thinker saw it (Qwen3-Omni artifacts; repeat for more turns)")
    p.add_argument("--out", type=Path, required=True, help="WAV file to write (16-bit mono)")
    p.add_argument("--codes", type=Path, default=None, help="also write the codec frames as JSON")
    p.add_argument("--speaker", default=None, help="voice name from the artifact's speakers")
    p.add_argument("--language", default=None, help="language name from the artifact, or auto")
    p.add_argument("--instruct", default=None, help="style instruction")
    p.add_argument("--greedy", action="store_true", help="argmax everywhere, repetition penalty 1.0")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--cp-spec-verify", type=int, default=0, metavar="W",
                   help="code-predictor speculative verify window: 0 = off, 2..8 (frames are unchanged when greedy, "
                        "the distribution when sampling)")
    p.add_argument("--max-frames", type=int, default=None, help="stop after this many frames")
    p.add_argument("--dual-track", "--streaming-text", dest="dual_track", action="store_const", const=True,
                   default=None, help="the dual-track layout: one text token per frame beside the codec track "
                                      "(the default with --ref-audio, as the reference clones)")
    p.add_argument("--whole-text", dest="dual_track", action="store_const", const=False,
                   help="all text in the prefill (the default for built-in speakers)")
    p.add_argument("--ref-audio", type=Path, default=None, metavar="WAV",
                   help="clone the voice of this recording (a PCM WAV, 1-30 s; Base artifacts): x-vector only, or "
                        "in context with --ref-text")
    p.add_argument("--ref-text", default=None, help="what --ref-audio says: clone in context (ICL)")
    p.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "tensorrt"])
    p.add_argument("--threads", type=thread_plan, default=ThreadPlan(), metavar="STAGE=N[,STAGE=N...]",
                   help="engine threads per stage, as [daemon.threads]: generation (default 1), vocoder (default 1, "
                        "on a thread of its own; 0: after each step on generation's), clone_encoder (default 1)")
    p.set_defaults(run=run)


def thread_plan(text: str) -> ThreadPlan:
    """--threads as argparse reads it (`edged synth`, `edged bench`)."""
    try:
        return ThreadPlan.parse(text)
    except ConfigError as exc:  # argparse names the option and exits 2
        raise argparse.ArgumentTypeError(str(exc)) from None


def offline_backend(name: str, threads: int) -> Backend:
    """The backend an offline command runs on; one whose packages are missing is a RequestError."""
    try:
        return make_backend(name, threads)
    except ImportError as exc:  # tensorrt without its packages
        raise RequestError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    try:
        artifact = load_artifact(args.artifact)
        sampling = Sampling.greedy() if args.greedy else Sampling.defaults(artifact.sampling)
        overrides = {"cp_spec_verify_size": args.cp_spec_verify} | ({"seed": args.seed} if args.seed is not None else {})
        sampling = sampling.with_overrides(overrides)
        if args.ref_text is not None and args.ref_audio is None:
            raise RequestError("--ref-text needs --ref-audio")
        if args.speaker is not None and args.ref_audio is not None:
            raise RequestError("--speaker and --ref-audio both name the voice: give one")
        threads: ThreadPlan = args.threads
        backend = offline_backend(args.backend, threads.generation)
        try:
            clone = _clone(artifact, threads, args.ref_audio, args.ref_text) if args.ref_audio else None
            request = SpeechRequest(id="synth", text=args.text, voice=args.speaker, language=args.language,
                                    instruct=args.instruct, sampling=sampling, dual_track=args.dual_track,
                                    max_frames=args.max_frames, context=tuple(("user", t) for t in args.user_text),
                                    clone=clone)
            synth = Synthesizer(artifact, backend, vocoder_threads=threads.vocoder)
            if artifact.vocoder_weights != "fp32":  # which of its vocoders runs here, and why
                print(f"edged synth: {synth.core.vocoder.form.line()}", file=sys.stderr)
            try:
                result = synth.synthesize([request])[0]
            finally:
                synth.close()
        finally:
            backend.close()
    except (ArtifactError, EngineError, RequestError, SamplingError, BadReference) as exc:
        print(f"edged synth: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        write_wav(args.out, result.pcm, artifact.sample_rate)
        if args.codes:
            args.codes.write_text(json.dumps({
                "frames": result.frames.tolist(), "sample_rate": artifact.sample_rate,
                "samples_per_frame": artifact.samples_per_frame}))
    except OSError as exc:
        print(f"edged synth: cannot write the output: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(result.report))
    return 0


def _clone(artifact, threads: ThreadPlan, path: Path, ref_text: str | None) -> ClonedVoice:
    """The voice of the recording at `path`, through the artifact's clone encoder: on ONNX Runtime
    whatever the synthesis runs on (its own sessions, with the plan's clone_encoder threads), as the
    daemon's voice thread runs it; `edged-engines plans` builds no plan for it."""
    try:
        pcm, rate = read_wav(path)
    except OSError as exc:
        raise BadReference(f"--ref-audio {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise BadReference(f"--ref-audio {exc}") from exc
    own = make_backend("onnxruntime", threads.clone_encoder)
    try:
        encoder = VoiceEncoder(artifact, own)
        encoder.preallocate()
        pcm = reference_pcm(pcm, rate, artifact.sample_rate, min_ms=MIN_REFERENCE_MS, max_ms=MAX_REFERENCE_MS)
        return encoder.encode(pcm, ref_text)
    finally:
        own.close()
