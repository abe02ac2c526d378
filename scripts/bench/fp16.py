#!/usr/bin/env python3
"""Quality of the fp16 twin of an artifact against fp32, graph by graph and end to end, on ONNX Runtime.

    python scripts/bench/fp16.py [--only tiny|real] [--work DIR]

For the tiny random checkpoint and one with the real Qwen3-TTS-12Hz-0.6B sizes (cached in --work, as
scripts/bench/synth.py makes them), `edged-engines fp16` makes the twin; then, with the fp32 core
generating greedily and each fp16 graph fed the very inputs its fp32 counterpart had:
- talker prefill and decode: max |hidden difference| and max |logit difference| (the hidden state
  through the checkpoint's codec head);
- code predictor: codes that agree, max |codec_sum difference|;
- vocoder: PCM SNR of the whole utterance's frames decoded by each;
- end to end (the fp16 artifact generating on its own): requests whose greedy frames equal fp32's (and
  their PCM SNR), and where the others first differ (after a flipped near-tie, greedy decoding goes
  its own way);
- wall time of the two on this CPU (fp16 is about memory and Jetson tensor cores, not CPU speed).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TEXTS, cached, load, machine, parser, prepare_case, unloadable

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer


def snr(ref: np.ndarray, got: np.ndarray) -> float:
    n = min(len(ref), len(got))
    return float(10 * np.log10(np.sum(ref[:n] ** 2) / max(np.sum((ref[:n] - got[:n]) ** 2), 1e-30)))


def head_weight(artifact) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(artifact.file("talker"))).graph
    return numpy_helper.to_array(next(i for i in graph.initializer if i.name.endswith("codec_head.weight")))


def per_graph(fp32_dir: Path, fp16_dir: Path, frames: int) -> dict[str, str]:
    """Teacher-forced: the fp32 core generates; each fp16 graph runs on the inputs fp32's had."""
    backend = make_backend("onnxruntime", threads=2)
    a32, a16 = load_artifact(fp32_dir), load_artifact(fp16_dir)
    core = Core(a32, backend)
    core.preallocate()
    t, tables = core.talker, a32.tables()
    e16 = {role: backend.load(a16.file(role)) for role in a16.graphs}
    w = head_weight(a32)

    def twin(engine, plan, out_names):
        """A plan of the fp16 engine on the fp32 plan's inputs (cast where the fp16 network's inputs are
        fp16: its KV cache), with outputs of its own; `run()` refreshes the cast inputs first."""
        outs = {n: backend.empty(plan.bindings[n].shape, engine.outputs[n].dtype) for n in out_names}
        inputs = {n: b for n, b in plan.bindings.items() if n not in out_names}
        cast = {n: backend.empty(b.shape, engine.inputs[n].dtype) for n, b in inputs.items()
                if engine.inputs[n].dtype != b.dtype}
        made = engine.plan({**inputs, **cast, **outs}, repeated=False)

        class Twin:
            def run(self) -> None:
                for n, b in cast.items():
                    b[...] = inputs[n]
                made.run()

        return Twin(), outs

    request = SpeechRequest("q", TEXTS[1], voice="vivian", language="english", sampling=Sampling.greedy(),
                            max_frames=frames)
    member = core.prepare(request, 0)
    prefill32 = t._prefill_plan(member.prompt.prefill_len)
    prefill_outs = [n for n in prefill32.bindings if n in e16["talker"].outputs]
    p16, p_out = twin(e16["talker"], prefill32, prefill_outs)
    prefill32.run()
    hidden32 = t.prefill_io["hidden"][0].copy()
    p16.run()
    prefill_diff = p_out["hidden"][0].astype(np.float32) - hidden32
    prefill_hidden, prefill_logits = np.abs(prefill_diff).max(), np.abs(prefill_diff @ w.T).max()
    decode32 = t.decode_plans[0][t.buckets[-1]]  # the whole cache: what the step's plan attends, and more
    decode16, d_out = twin(e16["talker"], decode32, [n for n in decode32.bindings if n in e16["talker"].outputs])
    sessions = [ort.InferenceSession(str(a.file("code_predictor")), providers=["CPUExecutionProvider"]) for a in (a32, a16)]
    hidden_d, logit_d, codes_same, codes_all, sum_d = 0.0, 0.0, 0, 0, 0.0
    while member.outcome.value == "running":
        hidden, code0 = t.hidden[:1].copy(), t.code0[:1].copy()
        core.step([member])
        if member.outcome.value == "running":  # the decode ran: fp16 on the same inputs
            decode16.run()
            diff = d_out["hidden"][0].astype(np.float32) - t.hidden[0]
            hidden_d, logit_d = max(hidden_d, np.abs(diff).max()), max(logit_d, np.abs(diff @ w.T).max())
        (codes32, sum32), (codes16, sum16) = (predictor_frame(s, a32, hidden, code0, tables) for s in sessions)
        codes_same += int(np.sum(codes32 == codes16))
        codes_all += codes32.size
        sum_d = max(sum_d, np.abs(sum32 - sum16).max())
    frames32 = core.frames(member).copy()
    pcm = [vocode(backend, a, engine, frames32) for a, engine in ((a32, core.vocoder.engine), (a16, e16["vocoder"]))]
    backend.close()
    return {"talker (prefill)": f"hidden {prefill_hidden:.1e}, logits {prefill_logits:.1e}",
            "talker (decode)": f"hidden {hidden_d:.1e}, logits {logit_d:.1e}",
            "code_predictor": f"codes agree {codes_same}/{codes_all}, codec_sum {sum_d:.1e}",
            "vocoder": f"PCM SNR {snr(*pcm):.1f} dB"}


def predictor_frame(session, a, hidden: np.ndarray, code0: np.ndarray, tables: dict[str, np.ndarray]):
    """One greedy frame of a code-predictor graph, pass by pass (engines.talker.predict_frame)."""
    from engines.talker import predict_frame, predictor_cache

    g = a.dims.code_groups
    cache = predictor_cache(session.get_inputs(), 1, g)
    sampling = {"temperature": np.zeros(1, np.float32), "top_k": np.zeros(1, np.int64), "top_p": np.ones(1, np.float32)}
    noise = np.full((1, g - 1, a.dims.codebook_size), 0.5, np.float32)
    return predict_frame(lambda feeds: session.run(None, feeds), hidden, code0, tables, g, cache, sampling, noise)


def vocode(backend, artifact, engine, frames: np.ndarray) -> np.ndarray:
    """All frames in one call of a fresh stream."""
    n, g = frames.shape
    e = backend.empty
    binds = {"codes": e((1, g, n), np.int64), "start": e((1,), np.int64),
             "pcm": e((1, n * artifact.samples_per_frame), np.float32)}
    for spec in artifact.graphs["vocoder"].state:
        binds[spec.input], binds[spec.output] = e((1, *spec.shape), np.float32), e((1, *spec.shape), np.float32)
    binds["codes"][0] = frames.T
    engine.plan(binds).run()
    return binds["pcm"][0].copy()


def end_to_end(fp32_dir: Path, fp16_dir: Path, frames: int) -> tuple[str, str]:
    requests = [SpeechRequest(f"r{i}", text, voice="vivian", language="english", sampling=Sampling.greedy(),
                              max_frames=frames) for i, text in enumerate(TEXTS)]
    runs, walls = [], []
    for art in (fp32_dir, fp16_dir):
        backend = make_backend("onnxruntime", threads=2)
        synth = Synthesizer(load_artifact(art), backend)
        synth.synthesize(requests[:1])  # warm-up
        t0 = time.perf_counter()
        runs.append(synth.synthesize(requests))
        walls.append(time.perf_counter() - t0)
        backend.close()
    diverged = []
    for a, b in zip(*runs):
        differ = np.flatnonzero(~np.all(a.frames[:len(b.frames)] == b.frames[:len(a.frames)], axis=1))
        if len(differ) or len(a.frames) != len(b.frames):
            diverged.append(int(differ[0]) if len(differ) else min(len(a.frames), len(b.frames)))
    same = [(a, b) for (a, b) in zip(*runs) if np.array_equal(a.frames, b.frames)]
    quality = f"{len(same)}/{len(requests)} requests frame for frame equal"
    if same:
        quality += f" (PCM SNR >= {min(snr(a.pcm, b.pcm) for a, b in same):.1f} dB)"
    if diverged:
        quality += f"; the others follow fp32 until frame {', '.join(map(str, diverged))} (a greedy near-tie), then differ"
    return quality, f"fp32 {walls[0] * 1e3:.0f} ms, fp16 {walls[1] * 1e3:.0f} ms ({len(requests)} x {frames} frames)"


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--only", choices=["tiny", "real"], default=None)
    args = p.parse_args()
    from engines.fp16 import convert_artifact

    print("\n".join(machine()), flush=True)
    rows = []
    for name in ["tiny", "real"] if args.only is None else [args.only]:
        frames = {"tiny": 60, "real": 16}[name]
        case = prepare_case(name, args.work, frames, 256, 0)
        fp16 = args.work / f"{case.artifact.name}-fp16"
        print(cached(fp16, "fp16 twin", lambda out, src=case.artifact: convert_artifact(src, out), unloadable), flush=True)
        size = lambda d: sum(f.stat().st_size for f in d.glob("*.onnx")) / 2**20  # noqa: E731
        print(f"== {name}: graphs {size(case.artifact):.0f} MiB fp32, {size(fp16):.0f} MiB fp16", flush=True)
        for graph, measured in per_graph(case.artifact, fp16, frames).items():
            rows.append((name, graph, measured))
        quality, speed = end_to_end(case.artifact, fp16, frames)
        rows += [(name, "end to end (greedy)", quality), (name, "wall time on this CPU", speed),
                 (name, "graph files", f"{size(case.artifact):.0f} MiB fp32 -> {size(fp16):.0f} MiB fp16")]
    print(f"\n{load()}\n\n| model | graph | fp16 vs fp32 |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
