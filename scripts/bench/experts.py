#!/usr/bin/env python3
"""Qwen3-Omni's 20-layer talker with its experts in each weight form, beside transformers' talker:
artifact size, bytes a decode step reads, the talker's decode step and RTF on ONNX Runtime (CPU).

    python scripts/bench/experts.py [--work DIR] [--forms fp32,fp16,int8,int4] [--threads 2] [--frames 16]
                                    [--repeats 3] [--keep]

1. A random checkpoint with the real Qwen3-Omni-30B-A3B talker (all 20 layers), code predictor and
   code2wav, saved as the published one is (bf16 shards and an index; `edged-engines tiny --family
   qwen3_omni --variant real --layers 20 --dtype bf16 --shard-size 2GB`), exported (`edged-engines
   export`), and each form made from the fp32 artifact (`edged-engines fp16`, `edged-engines
   quantize --weights int8|int4`; the experts' forms are engines/experts.py), all cached in --work.
2. Each form in a fresh process (its own resident memory, measured from outside): a `Synthesizer`
   boots, warms up, then the median of --repeats greedy runs of --frames frames (RTF), the talker's
   one-row decode step alone (median ms, scripts/bench/synth.py `decode_step_ms`) and the bytes that
   step reads at position 64 (scripts/roofline.py `stage_bytes`: every weight a product reads, the
   routed 6 of 128 experts' stacks, the KV rows).
3. transformers' talker (`Qwen3OmniMoeForConditionalGeneration`, fp32, its own generation and
   code2wav: engines/qwen3_omni/reference.py) cannot be held at 20 layers beside the others here
   (about 16 GiB in fp32), so it runs on the 6-layer fp32 checkpoint of scripts/bench/synth.py and
   is projected to 20 layers by its measured cost per talker layer (the same generation with half
   its layers; synth.py `reference_layer_ms`). Its decode step reads what fp32's does.

Each measured process holds /tmp/edged-heavy.lock while it runs. Checkpoint and artifacts are deleted
at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine
from export import BIN, FORMS, measure, size

OMNI_20 = ["--family", "qwen3_omni", "--variant", "real", "--layers", "20", "--dtype", "bf16", "--shard-size", "2GB"]
TEXT = "Hello there, how are you today?"


def measure_form(artifact: Path, threads: int, frames: int, repeats: int) -> dict:
    """In this process: RTF, the talker's decode step, the bytes it reads."""
    import numpy as np
    from roofline import stage_bytes
    from synth import decode_step_ms

    from edged.artifact import load_artifact
    from edged.backends import make_backend
    from edged.request import Sampling, SpeechRequest
    from edged.synth import Synthesizer

    a = load_artifact(artifact)
    t0 = time.perf_counter()
    synth = Synthesizer(a, make_backend("onnxruntime", threads=threads))
    boot = time.perf_counter() - t0
    request = SpeechRequest("e", TEXT, voice="ethan", sampling=Sampling.greedy(), max_frames=frames)
    synth.synthesize([request])
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = synth.synthesize([request])[0]
        walls.append(time.perf_counter() - t0)
    n = result.frames.shape[0]
    return {"rtf": float(np.median(walls)) / (n * a.frame_ms / 1e3), "frames": n, "boot_s": boot,
            "decode_ms": decode_step_ms(synth), "step_bytes": stage_bytes(a, 64, 4)["talker decode"]}


def reference(work: Path, threads: int, frames: int, repeats: int) -> dict:
    """transformers' talker on the 6-layer checkpoint, per frame measured and projected to 20 layers."""
    import numpy as np
    import torch
    from common import Case, cached
    from synth import load_reference, reference_layer_ms, run_reference

    from engines.tiny import build_real_dims

    ckpt = work / "ckpt-omni-real-s0"  # scripts/bench/synth.py's omni-real checkpoint (fp32, 6 layers)
    print(cached(ckpt, "checkpoint", lambda out: build_real_dims(out, 0, family_name="qwen3_omni")), file=sys.stderr)
    case = Case("omni-real", ckpt, ckpt, frames)
    torch.set_num_threads(threads)
    model = load_reference(case)
    layers = len(model.talker.model.layers)
    run_reference(case, model, TEXT, frames)
    runs = [run_reference(case, model, TEXT, frames)[0] for _ in range(repeats)]
    per_frame = float(np.median([r.wall_s / r.frames for r in runs])) * 1e3
    per_layer = reference_layer_ms(case, model, runs)
    projected = per_frame + (20 - layers) * per_layer
    return {"layers": layers, "frame_ms": per_frame, "layer_ms": per_layer, "frame_ms_20": projected,
            "rtf_20": projected / 80}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench-experts")
    parser.add_argument("--forms", default="fp32,fp16,int8,int4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # one form, in a child process
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure or args.reference:
        result = (measure_form(args.measure, args.threads, args.frames, args.repeats) if args.measure
                  else reference(args.work, args.threads, args.frames, args.repeats))
        print(json.dumps(result))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    for line in machine():
        print(line)
    ckpt, fp32 = args.work / "ckpt-omni-20", args.work / "art-omni-20-fp32"
    engines = str(BIN / "edged-engines")
    if not fp32.is_dir():
        if not ckpt.is_dir():
            measure("omni-20", "checkpoint", [engines, "tiny", *OMNI_20, "--out", str(ckpt)], ckpt)
        measure("omni-20", "export fp32", [engines, "export", "--checkpoint", str(ckpt), "--out", str(fp32)], fp32)
    artifacts = {"fp32": fp32}
    for form in args.forms.split(","):
        if form != "fp32":
            artifacts[form] = args.work / f"art-omni-20-{form}"
            if not artifacts[form].is_dir():
                measure("omni-20", f"form {form}", [engines, *FORMS[form], "--artifact", str(fp32), "--out",
                                                    str(artifacts[form])], artifacts[form])
    me = [sys.executable, __file__, "--work", str(args.work), "--threads", str(args.threads), "--frames",
          str(args.frames), "--repeats", str(args.repeats)]
    rows = []
    for form, path in artifacts.items():
        step = measure("omni-20", f"synth {form}", [*me, "--measure", str(path)])
        rows.append((form, size(path), step.peak_gib, json.loads(step.note.splitlines()[-1])))
    ref = json.loads(measure("omni-real", "reference", [*me, "--reference"]).note.splitlines()[-1])
    print(f"\nthreads {args.threads}, {args.frames} frames greedy, median of {args.repeats}\n")
    print("| talker (20 layers) | artifact GiB | decode step reads MB | decode step ms | RTF | peak RSS GiB |")
    print("|---|---|---|---|---|---|")
    for form, gib, peak, r in rows:
        print(f"| edged {form} | {gib:.2f} | {r['step_bytes'] / 1e6:.1f} | {r['decode_ms']:.1f} | {r['rtf']:.2f} | "
              f"{peak:.2f} |")
    print(f"| transformers fp32 (projected from {ref['layers']} layers: {ref['frame_ms']:.0f} ms a frame, "
          f"{ref['layer_ms']:.2f} ms a layer) | | as fp32 | | {ref['rtf_20']:.2f} | |")
    if not args.keep:
        for path in [ckpt, args.work / "ckpt-omni-real-s0", *artifacts.values()]:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
