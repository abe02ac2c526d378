#!/usr/bin/env python3
"""How much 8- and 4-bit weights change the model: teacher-forced against fp32 on the same checkpoint.

    python scripts/quant_quality.py --fp32 ARTIFACT --quantized ARTIFACT [ARTIFACT ...] [--frames 48]

The fp32 artifact speaks each text greedily; then every artifact is fed exactly those frames
(teacher forcing) and its decisions are compared with fp32's, one by one:

- code 0: the talker's logits from its `hidden` output and its own head weights (dequantized for a
  quantized artifact), with the reference's suppressed specials masked as the graph masks them;
- each residual group: the code predictor's head logits, exposed as an extra output of a copy of its
  pass graph; the groups before it are forced to fp32's codes through the sampling noise
  (temperature 100, top-k and top-p off, the forced code's Gumbel noise far above every other), so
  each group is judged on fp32's history;
- top-1 agreement (the quantized argmax is fp32's code), the KL divergence KL(p_fp32 || p_quant) of
  the softmax distributions at temperature 1, and the PCM SNR of the quantized artifact's
  teacher-forced argmax frames against fp32's frames, both vocoded by fp32's vocoder;
- the artifact's own vocoder (fp16 in an fp16 network) on fp32's frames: its PCM SNR against fp32's
  vocoder;
- greedy frames: the artifact speaks each text greedily on its own (no forcing), and the share of
  its frames equal to fp32's at the same index (one flipped near-tie changes every later frame).

Runs on ONNX Runtime with edged's session settings (the MatMulNBits accuracy level of
edged/backends/onnxruntime.py, or --accuracy-level).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.artifact import Artifact, load_artifact
from edged.backends import onnxruntime as edged_ort
from edged.families import get_family
from edged.request import SpeechRequest
from edged.vocoder.form import choose_vocoder
from engines.sampling import SPECIALS_PER_VOCAB
from engines.talker import predict_frame, predictor_cache
from engines.weight_form import dequantize

TEXTS = ["Hello world, this is edged speaking.", "Please keep the door closed when the heating is on."]
FORCE_T = 100.0


def session(path: Path | bytes, threads: int, level: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", level)
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts, providers=["CPUExecutionProvider"])


def weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    """A head's weight as the graph computes with it, [K, N] (x @ it): fp32, or dequantized."""
    inits = {i.name: i for i in model.graph.initializer}
    if name in inits:
        return numpy_helper.to_array(inits[name]).T  # Gemm transB: stored [N, K]
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith(f"{name}__t__q"))
    block = next(a.i for a in dq.attribute if a.name == "block_size")
    q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.int8)
    return dequantize(q, numpy_helper.to_array(inits[dq.input[1]]), block)


def head_output(model: onnx.ModelProto) -> str:
    """The code-predictor pass's head logits: the product that reads the bound `heads`."""
    return next(n.output[0] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] == "heads")


class Model:
    """One artifact's talker and code predictor on plain ORT sessions, with the logits exposed."""

    def __init__(self, artifact: Artifact, threads: int, level: str, tmp: Path):
        self.a = artifact
        self.codec_head = weight(onnx.load(str(artifact.file("talker"))), "talker.codec_head.weight")
        self.blocked = get_family(artifact.family).talking(artifact).eos_blocked_decisions
        self.talker = session(artifact.file("talker"), threads, level)
        cp = onnx.load(str(artifact.file("code_predictor")))
        cp.graph.output.append(onnx.ValueInfoProto(name=head_output(cp)))
        self.tables = artifact.tables()
        path = tmp / f"cp-{id(self)}.onnx"
        onnx.save_model(cp, str(path))
        self.cp = session(path, threads, level)

    def run(self, prompt_rows: np.ndarray, track: np.ndarray, frames: np.ndarray | None, count: int, pad: np.ndarray):
        """Greedy (frames None) or teacher-forced by `frames`; per frame: code-0 logits [V], group
        logits [G-1, Vc], the argmax frame [G], and the fp32-forced codec sum for the next step."""
        a, d = self.a, self.a.dims
        eos = a.special["codec_eos"]
        kv = {i.name: np.float16 if i.type == "tensor(float16)" else np.float32 for i in self.talker.get_inputs()}
        keys = [np.zeros((1, d.kv_heads, d.head_dim, a.max_seq), kv[f"past_keys_{i}"]) for i in range(d.layers)]
        values = [np.zeros((1, d.kv_heads, a.max_seq, d.head_dim), kv[f"past_values_{i}"]) for i in range(d.layers)]
        out = []
        rows, position = prompt_rows[None], 0
        for f in range(count):
            forced = None if frames is None else frames[f]
            hidden, new = self._talker(rows, position, keys, values, forced, f)
            t = rows.shape[1]
            for i in range(d.layers):
                keys[i][..., position:position + t] = new[2 * i]
                values[i][:, :, position:position + t] = new[2 * i + 1]
            position += t
            logits0 = _mask(hidden @ self.codec_head, eos, allow_eos=f >= self.blocked)
            code0 = int(np.argmax(logits0)) if forced is None else int(forced[0])
            codes, codec_sum, group_logits = self._cp(hidden, code0, forced)
            frame = np.array([int(np.argmax(logits0)), *(np.argmax(group_logits, -1))])
            out.append((logits0, group_logits, frame))
            text = track[f] if f < len(track) else pad
            rows = (codec_sum + text)[None, None].astype(np.float32)
        return out

    def _talker(self, rows, position, keys, values, forced, f):
        a = self.a
        vocab = a.dims.vocab
        noise, temperature = _force(forced[0] if forced is not None else None, vocab)
        feed = {"inputs_embeds": rows.astype(np.float32), "positions": np.array([position], np.int64),
                "slots": np.zeros(1 if position == 0 else a.max_seq, np.int64),
                "seen": np.zeros((1, vocab), np.float32), "repetition_penalty": np.ones(1, np.float32),
                "allow_eos": np.array([f >= self.blocked]), "temperature": temperature, "top_k": np.zeros(1, np.int64),
                "top_p": np.ones(1, np.float32), "noise": noise}
        one_slot = position == 0
        for i in range(a.dims.layers):
            feed[f"past_keys_{i}"] = keys[i][..., :1] if one_slot else keys[i]
            feed[f"past_values_{i}"] = values[i][:, :, :1] if one_slot else values[i]
        hidden, _, *new = self.talker.run(None, feed)
        return hidden[0], new

    def _cp(self, hidden, code0, forced):
        g, vc = self.a.dims.code_groups, self.a.dims.codebook_size
        noise = np.full((1, g - 1, vc), 1e-30 if forced is not None else 0.5, np.float32)
        if forced is not None:
            noise[0, np.arange(g - 1), forced[1:]] = 1 - 1e-7
        sampling = {"temperature": np.full(1, FORCE_T if forced is not None else 0.0, np.float32),
                    "top_k": np.zeros(1, np.int64), "top_p": np.ones(1, np.float32)}
        cache = predictor_cache(self.cp.get_inputs(), 1, g)
        logits = []

        def run(feeds):
            *outputs, head_logits = self.cp.run(None, feeds)
            logits.append(head_logits.reshape(-1, vc)[0])
            return outputs

        codes, codec_sum = predict_frame(run, hidden[None].astype(np.float32), np.array([code0]), self.tables, g,
                                         cache, sampling, noise)
        return codes[0], codec_sum[0], np.stack(logits)


def _force(code: int | None, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    if code is None:
        return np.full((1, vocab), 0.5, np.float32), np.zeros(1, np.float32)
    noise = np.full((1, vocab), 1e-30, np.float32)
    noise[0, code] = 1 - 1e-7
    return noise, np.full(1, FORCE_T, np.float32)


def _mask(logits: np.ndarray, eos: int, allow_eos: bool) -> np.ndarray:
    out = logits.astype(np.float64).copy()
    ids = np.arange(len(out))
    out[(ids >= len(out) - SPECIALS_PER_VOCAB) & (ids != eos)] = -np.inf
    if not allow_eos:
        out[eos] = -np.inf
    return out


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    finite = np.isfinite(p_logits)
    p, q = p_logits[finite], q_logits[finite]
    lp, lq = p - np.logaddexp.reduce(p), q - np.logaddexp.reduce(q)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def vocode(artifact: Artifact, frames: np.ndarray, threads: int) -> np.ndarray:
    s = session(artifact.file(choose_vocoder(artifact, "onnxruntime").role), threads, edged_ort.ACCURACY_LEVEL)  # as the daemon
    n, g = frames.shape
    feed = {"codes": frames.T[None].astype(np.int64), "start": np.zeros(1, np.int64)}
    for spec in artifact.graphs["vocoder"].state:
        feed[spec.input] = np.zeros((1, *spec.shape), np.float32)
    return s.run(["pcm"], feed)[0][0]


def name(artifact: Artifact) -> str:
    """The artifact's form: its network's precision, and its weights' form if quantized."""
    weights = "" if artifact.weights == "fp32" else \
        f" + {artifact.weights} {artifact.weight_target} (block {artifact.weight_block})"
    return artifact.precision + weights + ("" if artifact.vocoder_weights == "fp32" else f", {artifact.vocoder_weights} vocoder")


def prompt(artifact: Artifact, text: str):
    talking = get_family(artifact.family).talking(artifact)
    voice = next(iter(artifact.speakers), None)
    p = talking.layout.plan(SpeechRequest("q", text, voice=voice))
    tables = artifact.tables()
    rows = np.zeros((p.prefill_len, artifact.dims.hidden), np.float32)
    track = np.zeros((p.track_len, artifact.dims.hidden), np.float32)
    p.write(tables, rows, track)
    return rows, track, tables[talking.pad.table][talking.pad.ids[0]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fp32", type=Path, required=True)
    p.add_argument("--quantized", type=Path, nargs="+", required=True)
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--accuracy-level", default=edged_ort.ACCURACY_LEVEL, help="MatMulNBits accuracy level")
    args = p.parse_args(argv)
    ref_art = load_artifact(args.fp32)
    print(f"command: python {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        ref = Model(ref_art, args.threads, args.accuracy_level, Path(tmp))
        runs = []
        for text in TEXTS:
            rows, track, pad = prompt(ref_art, text)
            greedy = ref.run(rows, track, None, args.frames, pad)
            runs.append((rows, track, pad, greedy, np.stack([f for _, _, f in greedy])))
        print("| artifact | code 0 top-1 | groups top-1 (mean, min over groups) | KL code 0 | KL groups (mean) | "
              "PCM SNR dB | vocoder SNR dB | greedy frames equal |")
        print("|---|---|---|---|---|---|---|---|")
        for path in args.quantized:
            art = load_artifact(path)
            model = Model(art, args.threads, args.accuracy_level, Path(tmp))
            agree0, agree_g, kl0, klg, signal, error, vocoder_error, equal = [], [], [], [], 0.0, 0.0, 0.0, []
            for rows, track, pad, greedy, frames in runs:
                forced = model.run(rows, track, frames, len(frames), pad)
                for (l0, lg, ref_frame), (q0, qg, q_frame) in zip(greedy, forced):
                    agree0.append(q_frame[0] == ref_frame[0])
                    agree_g.append(q_frame[1:] == ref_frame[1:])
                    kl0.append(kl(l0, q0))
                    klg.append(np.mean([kl(a, b) for a, b in zip(lg, qg)]))
                ours = vocode(ref_art, frames, args.threads)
                theirs = vocode(ref_art, np.stack([f for _, _, f in forced]), args.threads)
                signal += float(np.sum(ours ** 2))
                error += float(np.sum((ours - theirs) ** 2))
                vocoder_error += float(np.sum((ours - vocode(art, frames, args.threads)) ** 2))
                alone = np.stack([f for _, _, f in model.run(rows, track, None, len(frames), pad)])
                equal.extend(np.all(alone == frames, axis=1))
            groups = np.mean(np.stack(agree_g), axis=0)
            snr, vocoder_snr = (10 * np.log10(signal / e) if e > 0 else float("inf") for e in (error, vocoder_error))
            print(f"| {name(art)} | {np.mean(agree0):.3f} | {groups.mean():.3f}, {groups.min():.3f} | {np.mean(kl0):.4f} | "
                  f"{np.mean(klg):.4f} | {snr:.1f} | {vocoder_snr:.1f} | {np.mean(equal):.3f} |", flush=True)
            del model
    print(f"\n{len(TEXTS)} texts x {args.frames} frames teacher-forced; accuracy level {args.accuracy_level}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
