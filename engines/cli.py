"""`edged-engines`: tiny checkpoints, artifact export and TensorRT plans (the toolchain).

`tiny`, `export` and `builtin` need the `export` extra (torch, transformers, the family's reference
package); `pull` needs only its huggingface_hub; `plans` needs TensorRT (the `jetson` extra, on the
device) and nothing else (`plans --verify` needs neither). A checkpoint is a directory or a Hugging
Face repo id (engines/hub.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from engines.registry import FAMILIES
from engines.weight_form import CPU_BLOCKS, JETSON_BLOCK, TARGETS, FormError, form, vocoder_form

BUILTIN = Path(__file__).resolve().parent.parent / "edged" / "data" / "tiny"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edged-engines", description="edged engine toolchain",
        epilog="A checkpoint is a local directory or a Hugging Face repo id (owner/name, e.g. "
               "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice), fetched through the hub cache: HF_TOKEN or `huggingface-cli "
               "login` for gated repos, HF_HUB_OFFLINE=1 to use the cache alone, HF_ENDPOINT for a mirror "
               "(docs/artifact.md, \"Getting a checkpoint\").")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("tiny", help="build a tiny random-weight checkpoint with the reference classes")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_tts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="0", help="shape variant: 0..3 (qwen3_omni: 0..2), or real (also 0.6b, "
                                                  "1.7b) for the real dimensions: Qwen3-TTS 0.6B (or 1.7B); Qwen3-Omni's "
                                                  "talker widths with --layers of its 20 layers")
    p.add_argument("--layers", type=int, default=None, help="qwen3_omni real: talker layers (default 6)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="real variants: the weights' type")
    p.add_argument("--shard-size", default=None,
                   help="real variants: save in shards of this size with model.safetensors.index.json (e.g. 2GB)")
    p.add_argument("--kind", choices=["custom_voice", "voice_design", "base"], default=None,
                   help="qwen3_tts: custom_voice (built-in speakers, the default), voice_design (no speakers: the "
                        "voice is described in a request's instruct) or base (voice cloning: a speaker encoder, no "
                        "built-in speakers)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(run=_tiny)

    p = commands.add_parser("pull", help="download what `export` reads of a Hugging Face checkpoint repo; prints "
                                         "its local directory")
    p.add_argument("repo_id", help="owner/name, e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    p.add_argument("--revision", default=None, help="a branch, tag or commit (default main); a commit pins it")
    p.add_argument("--local-dir", type=Path, default=None,
                   help="download into this directory instead of the hub cache (HF_HUB_CACHE)")
    p.set_defaults(run=_pull)

    p = commands.add_parser("export", help="checkpoint -> engine artifact (ONNX graphs + sidecars + artifact.json)")
    p.add_argument("--checkpoint", required=True,
                   help="a checkpoint directory, or a Hugging Face repo id (owner/name) whose files the export "
                        "reads are fetched first, as `pull` does")
    p.add_argument("--revision", default=None, help="with a repo id: a branch, tag or commit (default main)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="fp16: an fp16 network (fp16 activations, weights and KV cache) with fp32 norms, softmax, "
                        "heads and sampling (engines/fp16.py)")
    p.add_argument("--weights", choices=["fp32", "int8", "int4"], default="fp32",
                   help="int8 / int4: block-quantized matrix weights in the talker and code predictor "
                        "(engines/quantize.py)")
    p.add_argument("--target", choices=TARGETS, default="cpu",
                   help="the backend the quantized form is for: cpu (ONNX Runtime, an fp32 network) or jetson "
                        "(TensorRT 10.3: int4 only, in the fp16 network whatever --precision says; "
                        "engines/weight_form.py)")
    p.add_argument("--verbose", action="store_true",
                   help="show the libraries' messages (torch, transformers) as they come, not in OUT/export.log")
    p.add_argument("--vocoder", choices=["fp32", "int8"], default="fp32",
                   help="int8: a second vocoder whose convolutions are 8-bit products, about twice as fast on a "
                        "CPU with VNNI or ARM's dot product and not exact; the fp32 one stays beside it and runs on "
                        "other CPUs (ONNX Runtime only; engines/vocoder_int8.py, edged/vocoder/form.py)")
    p.set_defaults(run=_export)

    p = commands.add_parser("quantize", help="an int8 / int4 twin of an fp32 artifact, or for jetson of an fp32 or "
                                             "fp16 one (no torch needed)")
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--weights", choices=["int8", "int4"], default=None,
                   help="the talker and code predictor's matrix weights (engines/quantize.py)")
    p.add_argument("--vocoder", choices=["int8"], default=None,
                   help="a second vocoder whose convolutions are 8-bit products, about twice as fast on a CPU with "
                        "VNNI or ARM's dot product and not exact; the fp32 one stays beside it and runs on other "
                        "CPUs (ONNX Runtime only; engines/vocoder_int8.py, edged/vocoder/form.py)")
    p.add_argument("--target", choices=TARGETS, default="cpu",
                   help="the backend the form is for: cpu (ONNX Runtime's MatMulNBits, from an fp32 artifact) or "
                        "jetson (TensorRT 10.3: int4 with fp16 scales in the fp16 network, from an fp16 artifact or "
                        "an fp32 one made fp16 first; no gathered experts)")
    p.add_argument("--block", type=int, default=None,
                   help=f"rows of a column per scale (default: for cpu the largest of "
                        f"{', '.join(map(str, CPU_BLOCKS))} that divides every weight's K, {JETSON_BLOCK} for jetson)")
    p.set_defaults(run=_quantize)

    p = commands.add_parser("fp16", help="an fp16 twin of an fp32 artifact (no torch needed)")
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(run=_fp16)

    p = commands.add_parser("builtin", help="rebuild the built-in tiny artifact shipped inside edged")
    p.add_argument("--out", type=Path, default=BUILTIN)
    p.set_defaults(run=_builtin)

    p = commands.add_parser("plans", help="build TensorRT plans beside an artifact's ONNX graphs (on the device)")
    p.add_argument("artifact", type=Path)
    p.add_argument("--chunk-frames", type=int, default=4, help="the daemon's vocoder.chunk_frames")
    p.add_argument("--first-chunk-frames", type=int, default=1, help="the daemon's vocoder.first_chunk_frames")
    p.add_argument("--workspace-mib", type=int, default=1024, help="builder workspace limit")
    p.add_argument("--verify", action="store_true",
                   help="build nothing: re-hash each plan's ONNX graph and weights against its stamp (one line per "
                        "plan; exit 2 when one differs). Needs no TensorRT")
    p.set_defaults(run=_plans)

    args = parser.parse_args(argv)
    from engines.config import CheckpointError, ConfigError
    from engines.hub import HubError

    try:
        return args.run(args)
    except (ConfigError, CheckpointError, HubError) as exc:  # the checkpoint's fault, named: no traceback
        print(f"edged-engines {args.command}: {exc}", file=sys.stderr)
        return 2


def _pull(args: argparse.Namespace) -> int:
    from engines.hub import HubError, is_repo_id, pull

    if not is_repo_id(args.repo_id):
        raise HubError(f"{args.repo_id}: not a Hugging Face repo id (owner/name)")
    print(pull(args.repo_id, args.revision, args.local_dir))
    return 0


def _checkpoint(name: str, revision: str | None) -> Path:
    """--checkpoint: a directory that exists, else a repo id, pulled; anything else is an error."""
    from engines.hub import HubError, is_repo_id, pull

    path = Path(name)
    if path.exists():
        if not path.is_dir():
            raise HubError(f"{name}: not a directory (a checkpoint is a directory or a repo id owner/name)")
        if revision is not None:
            raise HubError(f"{name} is a local directory: --revision is for a repo id")
        return path
    if not is_repo_id(name):
        raise HubError(f"{name}: no such directory, and not a Hugging Face repo id (owner/name)")
    try:
        return pull(name, revision)
    except HubError as exc:  # it may have been meant as a path: say it is not one here either
        raise HubError(f"{exc} (and there is no directory {name} here)") from exc


def _tiny(args: argparse.Namespace) -> int:
    from engines.registry import family

    module = family(args.family)
    kind = {} if args.kind is None else {"kind": args.kind}
    if kind and args.family != "qwen3_tts":
        raise SystemExit(f"edged-engines tiny: --kind is for qwen3_tts checkpoints, not {args.family}")
    if args.variant in ("real", "0.6b", "1.7b"):
        if not hasattr(module, "build_real_dims"):
            raise SystemExit(f"edged-engines tiny: family {args.family} has no real-dimension checkpoint (variant real)")
        options = {"dtype": args.dtype, "shard_size": args.shard_size}
        if args.family == "qwen3_tts":
            options["size"] = "1.7b" if args.variant == "1.7b" else "0.6b"
        elif args.variant != "real":
            raise SystemExit(f"edged-engines tiny: {args.family}'s real checkpoint is variant real, not {args.variant}")
        if args.layers is not None:
            if args.family != "qwen3_omni":
                raise SystemExit("edged-engines tiny: --layers is for qwen3_omni")
            options["layers"] = args.layers
        module.build_real_dims(args.out, args.seed, **kind, **options)
    else:
        module.build_tiny(args.out, args.seed, int(args.variant), **kind)
    print(args.out)
    return 0


def _export(args: argparse.Namespace) -> int:
    from engines.export import export

    if args.precision == "fp16" and args.weights != "fp32" and args.target != "jetson":
        raise SystemExit("edged-engines export: --weights int8/int4 for cpu needs --precision fp32")
    if args.precision == "fp16" and args.vocoder != "fp32":
        raise SystemExit("edged-engines export: --vocoder int8 needs --precision fp32")
    weights = None if args.weights == "fp32" else args.weights
    vocoder = None if args.vocoder == "fp32" else args.vocoder
    _form(weights, args.target, None, vocoder)  # refused before the export, not after
    checkpoint = _checkpoint(args.checkpoint, args.revision)
    if weights and args.target == "jetson":
        from engines.quantize import EXPERTS_REFUSAL
        from engines.registry import EXPERT_FAMILIES, family_of

        if family_of(checkpoint).__name__.rsplit(".", 1)[-1] in EXPERT_FAMILIES:
            raise SystemExit(f"edged-engines: {EXPERTS_REFUSAL}")
    log = args.out / "export.log"
    stage = _stages("export", log, args.verbose)
    with stage(f"exporting {checkpoint} to {args.out}: the graphs, tables and tokenizer"):
        export(checkpoint, args.out, max_batch=args.max_batch, max_seq=args.max_seq)
    if weights or vocoder:
        from engines.quantize import quantize_artifact

        forms = [f"{weights} weights for {args.target}"] * bool(weights) + [f"an {vocoder} vocoder"] * bool(vocoder)
        with stage(f"quantizing: {' and '.join(forms)}"):
            quantize_artifact(args.out, args.out, weights, args.target, vocoder=vocoder)
    if args.precision == "fp16" and not (weights and args.target == "jetson"):  # the jetson form is already fp16
        from engines.fp16 import convert_artifact

        with stage("converting to the fp16 network"):
            convert_artifact(args.out, args.out)
    print(f"edged-engines export: wrote the artifact {args.out}; serve it with: edged serve --artifact {args.out}"
          + (" (on a Jetson, edged-engines plans first)" if args.precision == "fp16" or args.target == "jetson" else ""))
    return 0


def _stages(command: str, log: Path, verbose: bool):
    """A context per stage: its progress line, then the stage with the libraries' messages in `log`
    (`verbose`: on the terminal); a stage that fails names the log."""
    from engines.quiet import quiet

    @contextlib.contextmanager
    def stage(what: str):
        print(f"edged-engines {command}: {what}", flush=True)
        if verbose:
            yield
            return
        try:
            with quiet(log):
                yield
        except ValueError:  # a fault named in one line (the checkpoint's, a form's)
            raise
        except Exception:
            print(f"edged-engines {command}: the libraries' messages are in {log}", file=sys.stderr, flush=True)
            raise

    return stage


def _fp16(args: argparse.Namespace) -> int:
    from engines.fp16 import convert_artifact

    for role, stats in convert_artifact(args.artifact, args.out).items():
        print(f"{role}: " + ", ".join(f"{v} {k}" for k, v in stats.items()))
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from edged.artifact import load_artifact
    from engines.quantize import quantize_artifact

    if args.weights is None and args.vocoder is None:
        raise SystemExit("edged-engines quantize: give --weights (int8 / int4), --vocoder int8, or both")
    _form(args.weights, args.target, args.block, args.vocoder)
    try:
        stats = quantize_artifact(args.artifact, args.out, args.weights, args.target, args.block, vocoder=args.vocoder)
    except ValueError as exc:  # a form, source or artifact refused, naming why (FormError, ArtifactError are ones)
        raise SystemExit(f"edged-engines: {exc}") from exc
    for role, counts in stats.items():
        print(f"{role}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    made = load_artifact(args.out)
    if args.weights:
        print(f"form: {made.weights} for {made.weight_target}, {made.weight_block}-row blocks, {made.precision} network")
    if args.vocoder:
        print(f"vocoder: {made.vocoder_weights}")
    return 0


def _form(weights: str | None, target: str, block: int | None, vocoder: str | None = None) -> None:
    """Refuse a form the target cannot run, before anything is written."""
    try:
        if weights is not None:
            form(weights, target, block)
        if vocoder is not None:
            vocoder_form(vocoder, target)
    except FormError as exc:
        raise SystemExit(f"edged-engines: {exc}") from exc


def _builtin(args: argparse.Namespace) -> int:
    """The demo artifact: tiny qwen3_tts variant 0, seed 0, batch 4, 512 KV slots (about 40 s of audio),
    CustomVoice, with the clone encoder of its Base twin (the same speech tokenizer) so that voices
    can be enrolled on a fresh install."""
    from engines.export import export
    from engines.qwen3_tts.artifact import add_clone_encoder
    from engines.tiny import build_tiny

    with tempfile.TemporaryDirectory() as tmp:
        build_tiny(Path(tmp) / "ckpt", 0, 0)
        export(Path(tmp) / "ckpt", args.out, max_batch=4, max_seq=512)
        add_clone_encoder(args.out, build_tiny(Path(tmp) / "base", 0, 0, kind="base"))
    print(args.out)
    return 0


def _plans(args: argparse.Namespace) -> int:
    from engines.tensorrt import build_plans, verify_plans

    if args.verify:
        results = verify_plans(args.artifact)
        for plan, reason in results:
            print(f"{plan.name}: {reason or 'ok'}")
        return 2 if any(reason for _, reason in results) else 0

    plans = build_plans(args.artifact, chunk_frames=args.chunk_frames, first_chunk_frames=args.first_chunk_frames,
                        workspace=args.workspace_mib << 20)
    for plan in plans:
        print(f"{plan.name}: {plan.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
