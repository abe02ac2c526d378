#!/usr/bin/env python3
"""Voice cloning costs: enrolling a voice, and what an enrollment does to replies already running.

    python scripts/bench/clone.py [--only tiny|real] [--work DIR] [--frames N] [--repeats R]

1. Enrollment: the clone encoder of the artifact (the voice thread's own ONNX Runtime sessions, one
   thread, as the daemon runs it) on references of 3, 10 and 30 s: the speaker encoder alone
   (x-vector only) and with the codec encoder (in context). Median of R.
2. Running replies: the daemon (all cores) serves 2 streamed greedy replies of N frames; the time
   between consecutive `audio` chunks of a reply (a chunk is one vocoder window, 4 frames after the
   first) is measured with nothing else going on, and again while a 30 s in-context reference is
   enrolled in the middle of them. Reported: median and worst gap, both ways, in one run.

`real` is a random Base checkpoint with the Qwen3-TTS-12Hz-0.6B sizes (the real ECAPA-TDNN and Mimi
encoder), fp32.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cached, machine, parser, start_daemon, unloadable

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.client import Client
from edged.clone import VoiceEncoder

GREEDY = {"temperature": 0.0, "top_k": 0, "repetition_penalty": 1.0, "cp_temperature": 0.0, "cp_top_k": 0}
TEXT = "A reply that keeps talking while a new voice is enrolled beside it, one frame after another."


def reference(seconds: float, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    phase = 2 * np.pi * np.cumsum(130 + 20 * np.sin(2 * np.pi * 2 * t)) / 24000
    voiced = sum(0.2 / k * np.sin(k * phase) for k in range(1, 5))
    return (voiced + 0.01 * np.random.default_rng(seed).standard_normal(len(t))).astype(np.float32)


def prepare(name: str, work: Path) -> Path:
    from engines.export import export
    from engines.tiny import build_real_dims, build_tiny

    build = {"tiny": lambda out: build_tiny(out, 0, 0, kind="base"),
             "real": lambda out: build_real_dims(out, 0, kind="base")}[name]
    ckpt, art = work / f"ckpt-{name}-base-s0", work / f"art-{name}-base-s0-b4-s256"
    print(cached(ckpt, "checkpoint", build), flush=True)
    print(cached(art, "export", lambda out: export(ckpt, out, max_batch=4, max_seq=256), unloadable), flush=True)
    return art


def enrollment(art: Path, repeats: int) -> list[str]:
    encoder = VoiceEncoder(load_artifact(art), make_backend("onnxruntime", 1))
    encoder.preallocate()
    rows = []
    for seconds in (3, 10, 30):
        pcm = reference(seconds)
        for ref_text in (None, "What the reference says, word for word."):
            encoder.encode(pcm, ref_text)  # warm-up: first-run allocations of this length
            took = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                encoder.encode(pcm, ref_text)
                took.append(time.perf_counter() - t0)
            mode = "in context (x-vector + codes)" if ref_text else "x-vector only"
            rows.append(f"| {seconds} s | {mode} | {statistics.median(took) * 1e3:.0f} ms | "
                        f"{min(took) * 1e3:.0f} - {max(took) * 1e3:.0f} ms |")
    return rows


def gaps_while(endpoint: str, frames: int, enroll: bool) -> tuple[list[float], float | None]:
    """Two streamed replies; the gaps between their audio chunks (ms), and the enrollment's time."""
    arrivals: list[list[float]] = [[], []]
    started = threading.Barrier(3)

    def reply(i: int) -> None:
        with Client(endpoint, timeout_s=600) as client:
            utt = client.speak(TEXT, play=False, stream=True, max_audio_ms=frames * 80, sampling=GREEDY)
            for event in utt:
                if type(event).__name__ == "Audio":
                    arrivals[i].append(time.perf_counter())
                    if event.seq == 1:
                        started.wait()

    threads = [threading.Thread(target=reply, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait()
    took = None
    if enroll:
        with Client(endpoint, timeout_s=600) as client:
            t0 = time.perf_counter()
            client.voice_add(f"v{time.monotonic_ns()}", reference(30), 24000, ref_text="The reference, word for word.")
            took = time.perf_counter() - t0
    for t in threads:
        t.join()
    gaps = [(b - a) * 1e3 for times in arrivals for a, b in zip(times[1:], times[2:])]  # after the first window
    return gaps, took


def main() -> int:
    p = parser(__doc__, repeats=3)
    p.add_argument("--only", choices=["tiny", "real"], default=None)
    p.add_argument("--frames", type=int, default=None, help="frames per reply (default: tiny 400, real 40)")
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    for name in ["tiny", "real"] if args.only is None else [args.only]:
        art = prepare(name, args.work)
        print(f"\n== {name}: enrollment (the clone encoder, 1 thread)\n\n| reference | mode | median | range |\n"
              f"|---|---|---|---|", flush=True)
        print("\n".join(enrollment(art, args.repeats)), flush=True)
        frames = args.frames or {"tiny": 400, "real": 40}[name]
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_STATE_HOME"] = tmp  # the daemon's voices database: not the user's
            proc, endpoint = start_daemon(str(art), Path(tmp))
            try:
                gaps_while(endpoint, 8, False)  # warm-up
                quiet, _ = gaps_while(endpoint, frames, False)
                busy, took = gaps_while(endpoint, frames, True)
            finally:
                proc.terminate()
                proc.wait(60)
        print(f"\n== {name}: 2 streamed replies of {frames} frames; gaps between their audio chunks (4 frames)\n\n"
              f"| while | chunks | median gap | worst gap |\n|---|---|---|---|\n"
              f"| nothing else | {len(quiet)} | {statistics.median(quiet):.1f} ms | {max(quiet):.1f} ms |\n"
              f"| a 30 s in-context enrollment ({took * 1e3:.0f} ms) | {len(busy)} | {statistics.median(busy):.1f} ms | "
              f"{max(busy):.1f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
