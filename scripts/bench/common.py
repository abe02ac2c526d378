"""What the benchmarks share: runs and rows, the report table, the machine line, the cached tiny and
real-dimension checkpoints and artifacts, and the bare engine loop.

The bare loop drives the step core's own bound plans and kernels (prefill, code predictor, talker
decode, K/V row writes, the vocoder's windows) back to back, with none of the core's bookkeeping:
no members, no outcomes, no scheduler, no outputs. It never re-implements a stage: a contract change
in the stages reaches it through the same calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edged import bench
from edged.artifact import ArtifactError, load_artifact
from edged.client import Client
from edged.core import Core
from edged.locate import NoDaemon
from edged.request import SpeechRequest

TEXTS = list(bench.TEXTS)
SPEAKER, LANGUAGE = "vivian", "english"
OMNI_SPEAKER = "ethan"  # Qwen3-Omni: no languages; the text is the assistant reply, no earlier turns
MARKER = ".bench-done.json"  # written last: a directory without it is rebuilt
FAMILIES = {"tiny": "qwen3_tts", "real": "qwen3_tts", "omni-tiny": "qwen3_omni", "omni-real": "qwen3_omni"}
"""The benchmark checkpoints: the tiny random one and a random one with real dimensions, per family."""
WORK = Path(tempfile.gettempdir()) / "edged-bench"
"""Where the cached checkpoints and artifacts live unless --work says otherwise."""


def requests(batch: int, frames: int, family: str = "qwen3_tts", verify: int = 0) -> list[SpeechRequest]:
    """Greedy requests of `frames` frames (`verify`: the code predictor's speculative verify window)."""
    voice, language = (OMNI_SPEAKER, None) if family == "qwen3_omni" else (SPEAKER, LANGUAGE)
    return bench.requests(batch, frames, voice, language, verify)


# ------------------------------------------------------------------------------------ measurements


@dataclass
class Run:
    wall_s: float
    frames: int  # all members together
    first_frame_s: float | None
    first_audio_s: float | None
    generation_s: float | None = None
    """Per step (one frame of each member): the talker and code predictor."""
    vocoder_s: float | None = None
    """Per step: the vocoder's windows of every member, on whichever thread decodes them."""
    others: float | None = None
    """The share of the machine's CPU time that other processes took during the run."""


class CpuWatch:
    """How busy other processes keep the machine during a run (from /proc: Linux only)."""

    def __init__(self) -> None:
        self.start = self._times()

    @staticmethod
    def _times() -> tuple[float, float, float]:
        """(wall, busy CPU seconds of the machine, CPU seconds of this process: every thread)."""
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), sum(os.times()[:2])

    def others(self) -> float:
        (w0, b0, o0), (w1, b1, o1) = self.start, self._times()
        return max(0.0, (b1 - b0) - (o1 - o0)) / ((w1 - w0) * (os.cpu_count() or 1))


def wait_quiet(timeout_s: float, share: float = 0.1, window_s: float = 1.0) -> float:
    """On a shared machine: wait (at most `timeout_s`) until other processes took less than `share` of
    the CPU for a `window_s` window. Returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        watch = CpuWatch()
        time.sleep(window_s)
        if watch.others() < share:
            break
    return time.perf_counter() - t0


@dataclass
class Row:
    model: str
    path: str
    threads: str
    """generation+vocoder engine threads (edged), torch threads (reference)."""
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


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def print_table(rows: list[Row]) -> None:
    head = ["model", "thr", "batch", "path", "frames", "wall ms", "spread", "frames/s", "RTF",
            "1st frame ms", "1st audio ms", "gen ms/step", "voc ms/step", "others' CPU", "edged/bare", "edged/ref",
            "check"]
    body = []
    for r in rows:
        others = r.median_of("others")
        body.append([r.model, r.threads, str(r.batch), r.path, str(r.frames), f"{r.wall * 1e3:.1f}",
                     f"{r.spread * 100:.0f}%", f"{r.fps:.2f}", f"{r.rtf:.3f}",
                     _ms(r.median_of("first_frame_s")), _ms(r.median_of("first_audio_s")),
                     _ms(r.median_of("generation_s")), _ms(r.median_of("vocoder_s")),
                     "-" if others is None else f"{others * 100:.0f}%",
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

    from edged.cpu import this_cpu

    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch

        versions = f", torch {torch.__version__}"
    except ImportError:
        versions = ""
    return [
        f"command: python {shlex.join(sys.argv)}",
        f"machine: {os.cpu_count()} logical cores{mem}, {platform.system()} {platform.release()}",
        f"cpu: {this_cpu().line()}",
        f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}{versions}, numpy {np.__version__}",
        load(),
    ]


def profiled(path: Path, threads: int, feed: dict[str, np.ndarray], runs: int = 5) -> list[tuple[str, str, float]]:
    """(node, operator type, ms per call) of `runs` calls of the graph at `path` in a session made as
    the daemon's backend makes it (OrtBackend.session_options), profiled; the first call warms up."""

    import onnxruntime as ort

    from edged.backends.onnxruntime import OrtBackend

    opts = OrtBackend(threads).session_options()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / path.stem)
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[1:]
    spent: dict[tuple[str, str], float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(lo <= e["ts"] <= hi for lo, hi in calls):
            key = (e["name"].removesuffix("_kernel_time"), e["args"]["op_name"])
            spent[key] = spent.get(key, 0.0) + e["dur"]
    return [(node, op, us / runs / 1e3) for (node, op), us in spent.items()]


def step_feed(graph: Path, dims: dict[str, int], position: int) -> dict[str, np.ndarray]:
    """One greedy step of the talker or code-predictor graph at `graph` for every member: its inputs
    read from the graph, shaped by `dims` (the graph's dimension names), random embeddings, cache and
    heads (seeded), `position`, temperature 0, top-k 50, no repetition penalty."""
    import onnx

    rng = np.random.default_rng(0)
    feed: dict[str, np.ndarray] = {}
    for i in onnx.load(str(graph), load_external_data=False).graph.input:
        shape = [d.dim_value or dims[d.dim_param] for d in i.type.tensor_type.shape.dim]
        kind = i.type.tensor_type.elem_type
        if kind == onnx.TensorProto.INT64:
            feed[i.name] = np.full(shape, 50 if i.name == "top_k" else 0, np.int64)
        elif kind == onnx.TensorProto.BOOL:
            feed[i.name] = np.ones(shape, bool)
        else:
            feed[i.name] = rng.random(shape, dtype=np.float32) * (0.02 if i.name == "heads" else 1.0)
    feed["positions"][:] = position
    feed["temperature"][:] = 0.0  # greedy
    if "repetition_penalty" in feed:
        feed["repetition_penalty"][:] = 1.0
    return feed


def load() -> str:
    """Other work on the machine skews every timing: say how busy it was."""
    one, five, _ = os.getloadavg()
    return f"load average: {one:.2f} (1 min), {five:.2f} (5 min)"


# ------------------------------------------------------------------------------------ checkpoints


@dataclass
class Case:
    name: str
    checkpoint: Path
    artifact: Path
    frames: int
    max_seq: int = 256
    notes: list[str] = field(default_factory=list)
    weights: str = "fp32"
    block: int | None = None
    """Rows per quantization block (None: engines.quantize's default for the weights)."""
    agreeable: bool = False
    vocoder: str = "fp32"
    """The vocoder's form: fp32, or int8 (engines/vocoder_int8.py)."""
    reference: bool = True
    """Whether the reference runs on the checkpoint (fp32 weights, not agreeable)."""
    per_layer_ms: dict[tuple[str, int], float] = field(default_factory=dict)
    """(path, threads) -> ms per talker layer per frame (omni-real's projection to 20 layers)."""

    @property
    def family(self) -> str:
        return FAMILIES[self.name]

    @property
    def title(self) -> str:
        return self.name + ("-agreeable" if self.agreeable else "") + ("" if self.weights == "fp32" else f"-{self.weights}") \
            + (f"-b{self.block}" if self.block else "") + ("" if self.vocoder == "fp32" else f"-voc{self.vocoder}")


def cached(out: Path, what: str, build, stale=lambda out: None) -> str:
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

    family = FAMILIES[name]
    builder = {"tiny": lambda out: build_tiny(out, seed=seed, variant=0, family_name=family),
               "real": lambda out: build_real_dims(out, seed, family_name=family)}[name.removeprefix("omni-")]
    ckpt = work / f"ckpt-{name}-s{seed}"
    art = work / f"art-{name}-s{seed}-b4-s{max_seq}"
    notes = [cached(ckpt, "checkpoint", builder),
             cached(art, "export", lambda out: export(ckpt, out, max_batch=4, max_seq=max_seq), unloadable)]
    sidecars = sorted(p.name for p in art.iterdir() if p.name.endswith(".data"))
    notes.append("external data: " + (", ".join(sidecars) if sidecars else "none (every graph is one file)"))
    notes.append(f"artifact size: {sum(p.stat().st_size for p in art.iterdir() if p.is_file()) / 2**30:.2f} GiB")
    return Case(name, ckpt, art, frames, max_seq, notes)


def parser(doc: str, repeats: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's arguments: its description from the first paragraph of its docstring, --work
    and, given a default, --repeats."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=WORK, help="where the cached checkpoints and artifacts live")
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats)
    return p


def real_case(work: Path, frames: int = 16, max_seq: int = 256) -> Case:
    """The machine's lines, then the real-dimension Qwen3-TTS case (seed 0) that the graph benchmarks
    measure."""
    print("\n".join(machine()), flush=True)
    return prepare_case("real", work, frames, max_seq, 0)


def variant(case: Case, weights: str = "fp32", agreeable: bool = False,
            block: int | None = None, vocoder: str = "fp32") -> tuple[Path, list[str]]:
    """The artifact of `case` with `weights` (fp32, or int8 / int4 quantized from the fp32 one by
    engines.quantize, in blocks of `block` rows or its default), its vocoder in `vocoder`'s form
    (fp32, or int8: engines/vocoder_int8.py) and, `agreeable`, exported from the checkpoint's
    engines.agreeable twin (every greedy draft right); made or taken from the cache beside the case's
    own. With notes."""
    from engines.export import export
    from engines.quantize import default_cpu_block, quantize_artifact

    art, notes = case.artifact, []
    if agreeable:
        from engines.agreeable import make_agreeable

        ckpt = case.checkpoint.with_name(case.checkpoint.name + "-agreeable")
        notes.append(cached(ckpt, "agreeable checkpoint", lambda out: make_agreeable(case.checkpoint, out)))
        art = art.with_name(art.name + "-agreeable")
        notes.append(cached(art, "agreeable export", lambda out: export(ckpt, out, max_batch=4, max_seq=case.max_seq),
                            unloadable))
    if weights != "fp32":
        block = block or default_cpu_block(load_artifact(art))
        src, art = art, art.with_name(f"{art.name}-{weights}-b{block}")
        notes.append(cached(art, weights, lambda out: quantize_artifact(src, out, weights, block=block), unloadable))
    if vocoder != "fp32":
        src, art = art, art.with_name(f"{art.name}-voc{vocoder}")
        notes.append(cached(art, f"{vocoder} vocoder", lambda out: quantize_artifact(src, out, None, vocoder=vocoder),
                            lambda out: unloadable(out) or (None if (out / "vocoder_uint8.onnx").is_file()
                                                             else "no uint8 twin of its int8 vocoder")))
    return art, notes


def unloadable(art: Path) -> str | None:
    """Why edged cannot serve `art` (an artifact cached before a contract change), or None: its tables
    and every graph binding, by booting a Synthesizer on it."""
    from edged.backends import EngineError, make_backend
    from edged.synth import Synthesizer

    try:
        Synthesizer(load_artifact(art), make_backend("onnxruntime", threads=1)).close()
    except (ArtifactError, EngineError) as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------ the bare loop


class BareLoop:
    """The core's bound plans and kernels driven back to back, greedy, a fixed number of frames:
    prefill, then per frame the code predictor, the frame onto the port, the talker decode (its K/V
    rows appended by the plan), and the vocoder windows that are ready."""

    def __init__(self, core: Core):
        a = self.artifact = core.artifact
        self.core, self.talker, self.vocoder, self.port = core, core.talker, core.vocoder, core.port
        self.pcm = np.zeros((a.max_batch, a.max_seq * a.samples_per_frame), dtype=np.float32)

    def setup(self, reqs: list[SpeechRequest]) -> None:
        """Untimed: prompt rows and greedy sampling inputs for slots 0..n-1, fresh ports and streams."""
        t, n = self.talker, len(reqs)
        self.rows, self.prompt_lens, self.track_lens = [], [], []
        for slot, r in enumerate(reqs):
            prompt = t.plan(r)
            rows = np.zeros((prompt.prefill_len, self.artifact.dims.hidden), dtype=t.prefill_rows.dtype)
            prompt.write(t.tables, rows, t.track[slot])
            self.rows.append(rows)
            self.prompt_lens.append(prompt.prefill_len)
            self.track_lens.append(prompt.track_len)
            self.port.open(slot)
            self.vocoder.prepare(slot)
        t.seen[:n] = 0
        t.repetition_penalty[:n] = 1.0
        t.temperature[:n], t.top_k[:n], t.top_p[:n] = 0.0, 0, 1.0
        t.cp_temperature[:n], t.cp_top_k[:n], t.cp_top_p[:n] = 0.0, 0, 1.0
        t.allow_eos[:n] = t.eos_blocked_decisions == 0
        self.n = n

    def run(self, num_frames: int) -> Run:
        t, n, port, vocoder = self.talker, self.n, self.port, self.vocoder
        slots = range(n)
        first_frame = first_audio = None
        t0 = time.perf_counter()
        positions = list(self.prompt_lens)
        for slot in slots:
            np.copyto(t.prefill_rows[: positions[slot]], self.rows[slot])
            t.prefill(slot, positions[slot])
            t.seen[slot, t.code0[slot]] = 1
        for f in range(num_frames):
            t.predict(n)  # groups 1..G-1
            for slot in slots:
                port.append(slot, t.code0[slot], t.codes[slot])
            if first_frame is None:
                first_frame = time.perf_counter()
            if f + 1 < num_frames:  # the last frame needs no next code 0
                for slot in slots:  # the text track's row of this step (dual track), else the pad row
                    text = t.track[slot, f] if f < self.track_lens[slot] else t.pad_row
                    np.add(t.codec_sum[slot], text, out=t.inputs_embeds[slot])
                t.positions[:n] = positions
                t.appending[:n] = 1  # every row's K/V row joins the cache (the decode plan's append)
                t.allow_eos[:n] = f + 2 > t.eos_blocked_decisions  # decision f + 1 of the stream
                t.decode_plan(n, max(positions) + 1).run()
                for slot in slots:
                    positions[slot] += 1
                    t.seen[slot, t.code0[slot]] = 1
            else:
                for slot in slots:
                    port.close(slot)
            for slot in slots:
                window = vocoder.decode(slot)
                if window is not None:
                    self.pcm[slot, window.first_sample:window.first_sample + len(window.samples)] = window.samples
                    first_audio = first_audio or time.perf_counter()
        wall = time.perf_counter() - t0
        return Run(wall, n * num_frames, first_frame - t0, (first_audio or time.perf_counter()) - t0)

    def check(self, results: list, num_frames: int) -> str:
        """Same engine calls, same order: bare frames and PCM must equal edged's bit for bit."""
        samples = self.artifact.stream_samples(num_frames)
        for slot, r in enumerate(results):
            if r.frames.shape[0] != num_frames:
                return f"edged stopped {r.id} at {r.frames.shape[0]} frames ({r.reason}): not comparable"
            if not np.array_equal(self.port.frames(slot), r.frames):
                return "frames differ from edged"
            if not np.array_equal(self.pcm[slot, :samples], r.pcm):
                return f"pcm differs from edged by {np.abs(self.pcm[slot, :samples] - r.pcm).max():.2e}"
        return "= edged"


# ------------------------------------------------------------------------------------ the daemon


def start_daemon(artifact: str | None, tmp: Path, threads: str = "") -> tuple[subprocess.Popen, str]:
    """The daemon on `artifact` with the thread plan `threads` (STAGE=N,...; empty: the defaults)."""
    endpoint = f"ipc://{tmp / 'edged.sock'}"
    plan = "".join(f"{part.strip()}\n" for part in threads.split(",") if part.strip())
    (tmp / "edged.toml").write_text(f"[daemon]\nqueue_limit = 16\n[daemon.threads]\n{plan}")
    cmd = [sys.executable, "-m", "edged", "serve", "--config", str(tmp / "edged.toml"), "--listen", endpoint]
    if artifact:
        cmd += ["--artifact", artifact]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "w"))
    deadline = time.monotonic() + 300
    while True:
        try:
            with Client(endpoint, timeout_s=0.5) as client:
                client.status()
            return proc, endpoint
        except (TimeoutError, NoDaemon):  # not answering yet, or its socket not there yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "daemon.log").read_text()) from None


def stop_jack(jackd: subprocess.Popen) -> None:
    """Stop the JACK server of `start_jack`, PortAudio first: pyroomacoustics loads sounddevice in this
    process, and PortAudio must let go of the server before the server goes."""
    sounddevice = sys.modules.get("sounddevice")
    if sounddevice is not None:
        while sounddevice._initialized:
            sounddevice._terminate()
    jackd.terminate()
    jackd.wait(10)


def start_jack(prefix: str, realtime: bool = True) -> subprocess.Popen:
    """A JACK server on the dummy backend (24 kHz, 256-frame periods) under a fresh name, which the
    daemon's PortAudio and the tests' JACK clients then use (JACK_DEFAULT_SERVER); `realtime`: jackd
    -R (it and its clients' process threads SCHED_FIFO)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support import jackd as jack_servers

    name = f"{prefix}-{os.urandom(3).hex()}"
    os.environ.update(JACK_DEFAULT_SERVER=name, JACK_NO_AUDIO_RESERVATION="1", JACK_NO_START_SERVER="1")
    jack_servers.clear_stale_state()
    jackd = jack_servers.start(name, realtime=realtime, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    return jackd
