#!/usr/bin/env python3
"""Benchmark `edged synth` against a bare loop over the same engines and against qwen-tts.

    python scripts/bench_synth.py [--only tiny|real] [--frames N] [--threads 1 2] [--work DIR]

For each checkpoint (the tiny random one, and a random one with the real Qwen3-TTS-12Hz-0.6B
sizes), on the same weights, greedy, a fixed number of frames, after a warm-up, median of
`--repeats` runs:

1. edged: `Synthesizer.synthesize` end to end (prefill, talker, code predictor, vocoder windows);
2. bare: the same bound plans run back to back with no stage bookkeeping (prefill once, then per
   frame: code predictor, talker decode, K/V row writes, the vocoder windows the stage would
   decode) -- edged's overhead is the ratio of the two;
3. reference: qwen-tts `generate_custom_voice` on the checkpoint (talker + vocoder decode; no
   streaming, so its first audio is its total time).

Metrics: frames/s, real-time factor (wall seconds / audio seconds), time to first frame, time to
first audio (first PCM chunk handed to the sink). Bare's clock starts at its prefill (its prompt rows
are built untimed), so edged's first-frame lead also counts tokenizing and the host text projection.
Checkpoints and artifacts are cached in `--work`: the real-dims checkpoint is ~4.3 GB (~40 s to
build), its artifact ~5.9 GB (~12 min and ~11 GB of RAM to export on 2 cores). Needs the `export`
extra (torch, qwen-tts).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # an idle OpenMP thread stalls small matmuls
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import gc
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edged.artifact import Artifact, ArtifactError, load_artifact
from edged.backends import make_backend
from edged.request import SpeechRequest
from edged.synth import Synthesizer
from edged.talker.sampling import Sampling
from edged.vocoder.stage import VocoderStage

TEXTS = [
    "Hello world, this is edged speaking.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech on a small device, one frame at a time.",
    "Please keep the door closed when the heating is on.",
]
SPEAKER, LANGUAGE = "vivian", "english"
MARKER = ".bench-done.json"  # written last: a directory without it is rebuilt


# ------------------------------------------------------------------------------------ checkpoints


@dataclass
class Case:
    name: str
    checkpoint: Path
    artifact: Path
    frames: int
    notes: list[str] = field(default_factory=list)


def _cached(out: Path, what: str, build, stale=lambda out: None) -> str:
    """Run build(out) unless `out` holds a finished build that `stale(out)` (a reason or None)
    accepts; returns a line saying how long it took."""
    marker = out / MARKER
    if marker.is_file():
        reason = stale(out)
        if reason is None:
            took = json.loads(marker.read_text())["seconds"]
            return f"{what}: cached in {out.name} (took {took:.1f} s when made)"
        print(f"  {out.name} is out of date ({reason}): making it again", flush=True)
        marker.unlink()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    build(out)
    took = time.perf_counter() - t0
    marker.write_text(json.dumps({"seconds": took}))
    return f"{what}: made {out.name} in {took:.1f} s"


def prepare_case(name: str, work: Path, frames: int, max_seq: int, seed: int) -> Case:
    from engines.export import export
    from engines.tiny import build_real_dims, build_tiny

    builder = {"tiny": lambda out: build_tiny(out, seed=seed, variant=0),
               "real": lambda out: build_real_dims(out, seed)}[name]
    ckpt = work / f"ckpt-{name}-s{seed}"
    art = work / f"art-{name}-s{seed}-b4-s{max_seq}"
    notes = [_cached(ckpt, "checkpoint", builder),
             _cached(art, "export", lambda out: export(ckpt, out, max_batch=4, max_seq=max_seq), _unloadable)]
    sidecars = sorted(p.name for p in art.iterdir() if p.name.endswith(".data"))
    notes.append("external data: " + (", ".join(sidecars) if sidecars else "none (every graph is one file)"))
    notes.append("artifact size: " + _size(art))
    return Case(name, ckpt, art, frames, notes)


def _unloadable(art: Path) -> str | None:
    """Why edged cannot load `art` (an artifact cached before a contract change), or None."""
    try:
        load_artifact(art).tables()
    except ArtifactError as exc:
        return str(exc)
    return None


def _size(path: Path) -> str:
    total = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return f"{total / 2**30:.2f} GiB"


# ------------------------------------------------------------------------------------ measurements


@dataclass
class Run:
    wall_s: float
    frames: int  # all members together
    first_frame_s: float | None
    first_audio_s: float | None


@dataclass
class Row:
    model: str
    path: str
    threads: int
    batch: int
    runs: list[Run]
    frame_s: float
    ratio: float | None = None  # edged / bare
    vs_reference: float | None = None  # edged / reference
    check: str = ""

    @property
    def wall(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def spread(self) -> float:
        walls = [r.wall_s for r in self.runs]
        return (max(walls) - min(walls)) / statistics.median(walls)

    @property
    def frames(self) -> int:
        return self.runs[0].frames

    @property
    def fps(self) -> float:
        return self.frames / self.wall

    @property
    def rtf(self) -> float:
        # wall / audio of one stream: each member of a cohort must keep up on its own
        return self.wall / (self.frames / self.batch * self.frame_s)

    def median_of(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.runs if getattr(r, attr) is not None]
        return statistics.median(values) if values else None


def requests(batch: int, frames: int) -> list[SpeechRequest]:
    return [SpeechRequest(id=f"r{i}", text=TEXTS[i], voice=SPEAKER, language=LANGUAGE,
                          sampling=Sampling.greedy(), max_frames=frames) for i in range(batch)]


class FirstCall:
    """Wraps a callable and records when it was first called (one comparison per call)."""

    def __init__(self, fn):
        self.fn = fn
        self.at: float | None = None

    def __call__(self, *args):
        if self.at is None:
            self.at = time.perf_counter()
        return self.fn(*args)


def run_edged(synth: Synthesizer, reqs: list[SpeechRequest]) -> tuple[Run, list]:
    frame_hook, audio_hook = FirstCall(synth.port.append), FirstCall(synth.vocoder.sink)
    synth.port.append, synth.vocoder.sink = frame_hook, audio_hook
    try:
        t0 = time.perf_counter()
        results = synth.synthesize(reqs)
        wall = time.perf_counter() - t0
    finally:
        del synth.port.append  # back to the class method
        synth.vocoder.sink = audio_hook.fn
    frames = sum(r.frames.shape[0] for r in results)
    return Run(wall, frames, frame_hook.at - t0, audio_hook.at - t0), results


# ------------------------------------------------------------------------------------ the bare loop


class BareVocoder:
    """The vocoder windows VocoderStage decodes, on its plans, without its bookkeeping: the first
    window is `first_chunk` new frames, then `chunk` at a time, the tail once the talker stops; each
    call carries the stream's state (ping-pong between the two state buffers of the slot).
    Isolated here: a change of the vocoder contract touches only this class."""

    def __init__(self, stage: VocoderStage, groups: int, spf: int):
        self.stage, self.groups, self.spf = stage, groups, spf
        self.chunk, self.first_chunk = stage.chunk, stage.first_chunk
        self.side = np.zeros_like(stage.side)

    def reset(self, n: int) -> None:
        """Fresh streams in slots 0..n-1 (untimed: the stage zeroes the state at admission)."""
        for slot in range(n):
            self.stage.prepare(slot)
        self.side[:] = 0

    def decode(self, frames: np.ndarray, cursor: np.ndarray, published: int, closed: bool,
               pcm: np.ndarray) -> bool:
        """Decode every ready window of every slot; frames [n, F, G], pcm [n, samples]. True if any ran."""
        st, g, spf, ran = self.stage, self.groups, self.spf, False
        for slot in range(frames.shape[0]):
            while True:
                c = int(cursor[slot])
                want = self.first_chunk if c == 0 else self.chunk
                new = min(want, published - c)
                if new <= 0 or (new < want and not closed):
                    break
                np.copyto(st.codes[: g * new].reshape(g, new), frames[slot, c: c + new].T)
                st.start[slot] = c
                side = int(self.side[slot])
                st.plans[(slot, side, new)].run()
                self.side[slot] = 1 - side
                pcm[slot, c * spf:(c + new) * spf] = st.pcm[: new * spf]
                cursor[slot] = c + new
                ran = True
        return ran


class BareLoop:
    """The stage's bound plans and buffers, driven back to back: prefill, then per frame the code
    predictor, the talker decode and its K/V row writes, and the vocoder windows. Greedy only."""

    def __init__(self, synth: Synthesizer):
        a = synth.artifact
        self.artifact, self.talker = a, synth.talker
        self.vocoder = BareVocoder(synth.vocoder, a.dims.code_groups, a.samples_per_frame)
        self.frames = np.zeros((a.max_batch, a.max_seq, a.dims.code_groups), dtype=np.int64)  # [B, F, G]
        self.pcm = np.zeros((a.max_batch, a.max_seq * a.samples_per_frame), dtype=np.float32)
        self.cursor = np.zeros(a.max_batch, dtype=np.int64)

    def setup(self, reqs: list[SpeechRequest]) -> None:
        """Untimed: prompt rows and greedy sampling inputs for slots 0..n-1, one prefill plan each."""
        t = self.talker
        n = len(reqs)
        self.rows, self.prefill_plans, self.prompt_lens = [], [], []
        for slot, r in enumerate(reqs):
            prompt = t.builder.plan(r)
            rows = np.zeros((prompt.prefill_len, self.artifact.dims.hidden), dtype=np.float32)
            t.builder.write(prompt, rows, t.track[slot])
            self.rows.append(rows)
            self.prompt_lens.append(prompt.prefill_len)
            self.prefill_plans.append(t._prefill_plan(prompt.prefill_len, slot))  # the stage's own binding
        t.seen[:n] = 0.0
        t.repetition_penalty[:n] = 1.0
        t.temperature[:n], t.top_k[:n], t.top_p[:n] = 0.0, 0, 1.0
        t.cp_temperature[:n], t.cp_top_k[:n], t.cp_top_p[:n] = 0.0, 0, 1.0
        t.allow_eos[:n] = False
        self.vocoder.reset(n)
        self.n = n

    def run(self, num_frames: int) -> Run:
        t, n, vocoder = self.talker, self.n, self.vocoder
        rows = np.arange(n)
        frames, cursor, pcm = self.frames[:n], self.cursor[:n], self.pcm[:n]
        cursor[:] = 0
        first_frame = first_audio = None
        t0 = time.perf_counter()
        positions = np.array(self.prompt_lens, dtype=np.int64)
        for slot in range(n):  # prefill
            np.copyto(t.prefill_rows[: positions[slot]], self.rows[slot])
            self.prefill_plans[slot].run()
            t._load_prefill_kv(int(positions[slot]), slot)
        t.seen[rows, t.code0[:n]] = 1.0
        cp, decode = t.cp_plans[n - 1], t.decode_plans[n - 1]
        for f in range(num_frames):
            cp.run()  # groups 1..G-1
            frames[:, f, 0] = t.code0[:n]
            frames[:, f, 1:] = t.codes[:n]
            if first_frame is None:
                first_frame = time.perf_counter()
            if f + 1 < num_frames:  # the last frame needs no next code 0
                np.add(t.codec_sum[:n], t.tts_pad, out=t.inputs_embeds[:n])
                t.positions[:n] = positions
                t.allow_eos[:n] = f >= 1  # eos masked for the first two decisions
                decode.run()
                for keys, values, new_k, new_v in zip(t.keys, t.values, t.new_keys, t.new_values):
                    keys[rows, :, :, positions] = new_k[:n, :, :, 0]  # [B, Hkv, D, S]
                    values[rows, :, positions] = new_v[:n, :, 0]  # [B, Hkv, S, D]
                positions += 1
                t.seen[rows, t.code0[:n]] = 1.0
            if vocoder.decode(frames, cursor, f + 1, False, pcm) and first_audio is None:
                first_audio = time.perf_counter()
        vocoder.decode(frames, cursor, num_frames, True, pcm)
        wall = time.perf_counter() - t0
        return Run(wall, n * num_frames, first_frame - t0, (first_audio or time.perf_counter()) - t0)


# ------------------------------------------------------------------------------------ the reference


def run_reference(model, text: str, frames: int) -> tuple[Run, np.ndarray, np.ndarray]:
    from engines.reference import reference_synthesize

    t0 = time.perf_counter()
    codes, pcm = reference_synthesize(model, text, speaker=SPEAKER, language=LANGUAGE, max_frames=frames, greedy=True)
    wall = time.perf_counter() - t0
    return Run(wall, codes.shape[0], None, wall), codes, pcm


# ------------------------------------------------------------------------------------ one case


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
        bare = BareLoop(synth)
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
            check = _bare_check(artifact, bare, results, case.frames)
            if batch == 1:
                edged_frames[t] = results
            e = Row(case.name, "edged", t, batch, e_runs, frame_s)
            b = Row(case.name, "bare", t, batch, b_runs, frame_s, check=check)
            e.ratio = e.wall / b.wall
            out += [b, e]
            _progress(out[-2:])
        if profile and t == threads[0]:
            _profile(synth, requests(1, case.frames))
        del synth, bare
        gc.collect()
    out += _bench_reference(case, threads, repeats, frame_s, edged_frames, out)
    return out


def _bare_check(a: Artifact, bare: BareLoop, results: list, num_frames: int) -> str:
    """Same engine calls, same order: bare frames and PCM must equal edged's bit for bit."""
    spf = a.samples_per_frame
    for slot, r in enumerate(results):
        if r.frames.shape[0] != num_frames:
            return f"edged stopped {r.id} at {r.frames.shape[0]} frames ({r.reason}): not comparable"
        if not np.array_equal(bare.frames[slot, :num_frames], r.frames):
            return "frames differ from edged"
        if not np.array_equal(bare.pcm[slot, : num_frames * spf], r.pcm):
            return f"pcm differs from edged by {np.abs(bare.pcm[slot, : num_frames * spf] - r.pcm).max():.2e}"
    return "= edged"


def _bench_reference(case: Case, threads: list[int], repeats: int, frame_s: float,
                     edged_frames: dict[int, list], rows: list[Row]) -> list[Row]:
    import torch

    from engines.reference import load_reference

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
        _progress([ref])
        for row in rows:
            if row.path == "edged" and row.threads == t and row.batch == 1:
                row.vs_reference = row.wall / ref.wall
    torch.set_num_threads(1)
    del model
    gc.collect()
    return out


def _profile(synth: Synthesizer, reqs: list[SpeechRequest]) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    synth.synthesize(reqs)
    prof.disable()
    print("\n-- cProfile of one edged run (top 15 by own time) --")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


# ------------------------------------------------------------------------------------ report


def _progress(rows: list[Row]) -> None:
    for r in rows:
        print(f"  [{r.model} t={r.threads} b={r.batch}] {r.path}: {r.wall * 1e3:.1f} ms median "
              f"({', '.join(f'{x.wall_s * 1e3:.1f}' for x in r.runs)})", flush=True)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def print_table(rows: list[Row]) -> None:
    head = ["model", "thr", "batch", "path", "frames", "wall ms", "spread", "frames/s", "RTF",
            "1st frame ms", "1st audio ms", "edged/bare", "edged/ref", "check"]
    body = []
    for r in rows:
        body.append([r.model, str(r.threads), str(r.batch), r.path, str(r.frames), f"{r.wall * 1e3:.1f}",
                     f"{r.spread * 100:.0f}%", f"{r.fps:.2f}", f"{r.rtf:.3f}",
                     _ms(r.median_of("first_frame_s")), _ms(r.median_of("first_audio_s")),
                     f"{r.ratio:.3f}" if r.ratio else "", f"{r.vs_reference:.3f}" if r.vs_reference else "",
                     r.check])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for cells in body:
        print(line(cells))


def machine() -> list[str]:
    import onnxruntime
    import torch

    cpu = platform.processor() or "?"
    try:
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                cpu = text_line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return [
        f"command: python {shlex.join(sys.argv)}",
        f"machine: {cpu}, {os.cpu_count()} logical cores{mem}, {platform.system()} {platform.release()}",
        f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, "
        f"numpy {np.__version__}",
        _load(),
    ]


def _load() -> str:
    """Other work on the machine skews every timing: say how busy it was."""
    one, five, _ = os.getloadavg()
    return f"load average: {one:.2f} (1 min), {five:.2f} (5 min)"


# ------------------------------------------------------------------------------------ main


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
    print("\n" + "\n".join(header) + f"\nat the end, {_load()}")
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
