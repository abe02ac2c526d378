#!/usr/bin/env python3
"""The vocoder graph alone at the real Qwen3-TTS 0.6B dimensions: what a window costs, whether one
call for a cohort costs less than a call per member, and where the time goes.

    python scripts/bench/vocoder.py [--threads 1] [--repeats 5] [--batch 4] [--frames 4] [--work DIR]

The random real-dimension checkpoint's fp32 artifact comes from scripts/bench/common.py's cache in
`--work` (every weight form keeps the vocoder in fp32). Sessions are made by the daemon's own ONNX
Runtime backend (its options and thread count). Each round times `--batch` windows of `--frames`
frames three ways, in turn, so drift on a shared machine hits them alike: one call per member
(batch 1, as the daemon decodes today), one call for them all (batch B), and two calls of B / 2;
the median of `--repeats` rounds after a warm-up round. Then one profiled session gives the time
per operator type of a batch-1 window. Every call starts from the same state (a window
`--frames` frames into a stream), which is what a streaming window costs. Last, the fp32 vocoder
against its int8 form (`edged-engines quantize --vocoder int8`, engines/vocoder_int8.py), made from
the fp32 artifact into the same cache, and against the same int8 values with uint8 weights (zero
point 128: ONNX Runtime's uint8 x uint8 kernels, exact on x86 without VNNI; the artifact's
vocoder_uint8): one random utterance of 24 frames streamed
in windows of `--frames` through each in turn, round after round: ms per frame, the int8 PCM's signal-to-noise
ratio against the fp32 PCM, and a window of the int8 twin that runs on this CPU (the signed one where
none does) profiled by operator.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import parser, profiled, real_case, variant


def feeds(artifact, batch: int, frames: int) -> dict[str, np.ndarray]:
    """A window of `frames` random codes for `batch` members, `frames` frames into their streams."""
    rng = np.random.default_rng(0)
    g = artifact.dims.code_groups
    out = {"codes": rng.integers(0, artifact.dims.codebook_size, (batch, g, frames)).astype(np.int64),
           "start": np.full(batch, frames, np.int64)}
    for spec in artifact.graphs["vocoder"].state:
        out[spec.input] = np.zeros((batch, *spec.shape), np.float32)
    return out


def timed(session, feed: dict[str, np.ndarray], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - t0) * 1e3


def profile(path: Path, threads: int, feed: dict[str, np.ndarray]) -> list[tuple[str, float, int]]:
    """(operator type, ms per call, nodes) of a profiled session, the largest first."""
    spent: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    for _, op, ms in profiled(path, threads, feed):
        spent[op] += ms
        nodes[op] += 1
    return [(op, ms, nodes[op]) for op, ms in spent.most_common()]


def stream(session, artifact, codes: np.ndarray, frames: int) -> tuple[np.ndarray, float]:
    """codes [1, G, F] decoded window by window of `frames` from fresh state, as the daemon streams
    them: (the PCM, ms spent in the calls)."""
    state = {s.input: np.zeros((1, *s.shape), np.float32) for s in artifact.graphs["vocoder"].state}
    outputs = ["pcm", *(s.output for s in artifact.graphs["vocoder"].state)]
    pcm, spent = [], 0.0
    for first in range(0, codes.shape[-1], frames):
        t0 = time.perf_counter()
        out = session.run(outputs, {"codes": codes[..., first:first + frames], "start": np.array([first]), **state})
        spent += (time.perf_counter() - t0) * 1e3
        pcm.append(out[0])
        state = {s.input: v for s, v in zip(artifact.graphs["vocoder"].state, out[1:])}
    return np.concatenate(pcm, axis=1), spent


def forms(case, threads: int, repeats: int, frames: int, utterance: int = 24) -> None:
    """The fp32 vocoder against the int8 one (engines/vocoder_int8.py) on one random utterance, in
    turn, round after round: ms per frame, and the int8 PCM's signal-to-noise ratio against fp32's."""
    from edged.artifact import load_artifact
    from edged.backends.onnxruntime import OrtBackend
    from edged.vocoder.form import choose_vocoder

    int8_path, notes = variant(case, vocoder="int8")
    print("\n".join(notes), flush=True)
    fp32, int8 = load_artifact(case.artifact), load_artifact(int8_path)
    arts = {"fp32": fp32, "int8": int8, "int8, uint8 weights": int8}
    graphs = {"fp32": fp32.file("vocoder"), "int8": int8.file("vocoder_int8"),  # all, whatever runs here
              "int8, uint8 weights": int8.file("vocoder_uint8")}
    form = choose_vocoder(int8, "onnxruntime")
    print(f"the daemon on this CPU: {form.line()}", flush=True)
    sessions = {form: OrtBackend(threads).load(path).session for form, path in graphs.items()}  # type: ignore[attr-defined]
    rng = np.random.default_rng(1)
    a = arts["fp32"]
    codes = rng.integers(0, a.dims.codebook_size, (1, a.dims.code_groups, utterance)).astype(np.int64)
    spent: dict[str, list[float]] = {form: [] for form in arts}
    pcm = {}
    for _ in range(repeats + 1):  # the first round warms up
        for form, session in sessions.items():
            pcm[form], ms = stream(session, arts[form], codes, frames)
            spent[form].append(ms / utterance)
    print(f"\nfp32 and int8 vocoder, one utterance of {utterance} frames in windows of {frames}, {threads} thread(s), "
          f"median of {repeats} interleaved rounds\n")
    print("| vocoder | ms per frame | SNR against fp32 |\n|---|---|---|")
    for form, ms in spent.items():
        noise = np.linalg.norm(pcm["fp32"] - pcm[form])
        snr = "-" if form == "fp32" else f"{20 * np.log10(np.linalg.norm(pcm['fp32']) / noise):.1f} dB"
        print(f"| {form} | {float(np.median(ms[1:])):.2f} | {snr} |")
    twin = form.role if form.role != "vocoder" else "vocoder_int8"  # the int8 twin that runs here, or the signed one
    ops = profile(int8.file(twin), threads, feeds(int8, 1, frames))
    total = sum(ms for _, ms, _ in ops)
    print(f"\nthe int8 vocoder ({twin}), one batch-1 window of {frames} frames, profiled: {total:.1f} ms in kernels\n")
    print("| operator | ms | nodes | share |\n|---|---|---|---|")
    for op, ms, n in ops[:8]:
        print(f"| {op} | {ms:.1f} | {n} | {100 * ms / total:.1f} % |")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=4, help="frames per window (the daemon's chunk_frames)")
    args = p.parse_args(argv)
    if args.batch < 2 or args.batch % 2:
        p.error("--batch must be even and at least 2")
    from edged.artifact import load_artifact
    from edged.backends.onnxruntime import OrtBackend

    case = real_case(args.work)
    artifact = load_artifact(case.artifact)
    path = artifact.file("vocoder")
    session = OrtBackend(args.threads).load(path).session  # type: ignore[attr-defined]
    b, f = args.batch, args.frames
    ways = {f"{b} calls of batch 1": (feeds(artifact, 1, f), b),
            f"1 call of batch {b}": (feeds(artifact, b, f), 1),
            f"2 calls of batch {b // 2}": (feeds(artifact, b // 2, f), 2)}
    spent: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.repeats + 1):  # the first round warms up
        for way, (feed, calls) in ways.items():
            spent[way].append(timed(session, feed, calls))
    print(f"\n{b} windows of {f} frames, {args.threads} thread(s), median of {args.repeats} interleaved rounds\n")
    print("| decoded as | ms for the windows | ms per frame |\n|---|---|---|")
    for way, ms in spent.items():
        median = float(np.median(ms[1:]))
        print(f"| {way} | {median:.1f} | {median / (b * f):.2f} |")
    ops = profile(path, args.threads, feeds(artifact, 1, f))
    total = sum(ms for _, ms, _ in ops)
    print(f"\none batch-1 window of {f} frames, profiled: {total:.1f} ms in kernels\n")
    print("| operator | ms | nodes | share |\n|---|---|---|---|")
    for op, ms, n in ops[:8]:
        print(f"| {op} | {ms:.1f} | {n} | {100 * ms / total:.1f} % |")
    forms(case, args.threads, args.repeats, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
