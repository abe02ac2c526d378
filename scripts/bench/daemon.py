#!/usr/bin/env python3
"""Benchmark the daemon end to end over the protocol against the bare engine loop, same artifact.

    python scripts/bench/daemon.py [--artifact DIR] [--frames N] [--threads STAGE=N,...] [--repeats R]

The daemon (`edged serve`, a subprocess, with the thread plan `--threads`, as [daemon.threads])
serves 1 and then 4 concurrent greedy requests of N frames, each from its own client thread over
ipc:// with `stream: true`; the bare loop (the same bound plans and kernels run back to back,
common.BareLoop, the vocoder after each frame on the plan's generation threads) makes the same
frames in this process. With `vocoder=0` both decode audio inline: daemon/bare is the daemon's
overhead; with the vocoder on its own thread the daemon also overlaps it.
Prints frames/s (all requests together), the ratio daemon/bare, and the time to first audio chunk
as a client sees it (send -> first `audio` message) next to the bare loop's first PCM. Median of
R runs after a warm-up; the daemon and the bare loop alternate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LANGUAGE, SPEAKER, TEXTS, BareLoop, Run, machine, requests, start_daemon

from edged.artifact import load_artifact
from edged.backends import make_backend
from edged.client import Client
from edged.config import ThreadPlan
from edged.core import Core

GREEDY = {"temperature": 0.0, "top_k": 0, "repetition_penalty": 1.0, "cp_temperature": 0.0, "cp_top_k": 0}


def run_daemon(endpoint: str, batch: int, frames: int) -> Run:
    """`batch` clients, one request each, all at once; wall until the last `done`."""
    first_audio: list[float] = []
    barrier = threading.Barrier(batch + 1)

    def one(i: int) -> None:
        with Client(endpoint, timeout_s=600) as client:
            barrier.wait()
            sent = time.perf_counter()
            utterance = client.speak(TEXTS[i], voice=SPEAKER, language=LANGUAGE,
                                     play=False, stream=True, max_audio_ms=frames * 80, sampling=GREEDY)
            for event in utterance:
                if type(event).__name__ == "Audio" and event.seq == 0:
                    first_audio.append(time.perf_counter() - sent)
            assert utterance.done.reason == "length" and utterance.done.report["frames"] == frames

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return Run(time.perf_counter() - t0, batch * frames, None, statistics.median(first_audio))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", default=None, help="artifact directory (default: the built-in tiny one)")
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--threads", type=ThreadPlan.parse, default=ThreadPlan(), metavar="STAGE=N[,STAGE=N...]")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    print("\n".join(machine()))
    artifact = load_artifact(args.artifact)
    plan = args.threads
    core = Core(artifact, make_backend("onnxruntime", threads=plan.generation))
    core.preallocate()
    bare = BareLoop(core)
    print(f"artifact: {artifact.path} ({artifact.family}, max_batch {artifact.max_batch}), {args.frames} frames "
          f"per request, threads {plan}, median of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint = start_daemon(args.artifact, Path(tmp), str(plan))
        try:
            print(f"\n{'batch':>5} {'path':>7} {'frames/s':>9} {'wall ms':>9} {'1st audio ms':>13} {'daemon/bare':>12}")
            for batch in (1, 4):
                bare.setup(requests(batch, args.frames))
                run_daemon(endpoint, batch, args.frames), bare.run(args.frames)  # warm-up
                daemon_runs, bare_runs = [], []
                for _ in range(args.repeats):
                    daemon_runs.append(run_daemon(endpoint, batch, args.frames))
                    bare.setup(requests(batch, args.frames))
                    bare_runs.append(bare.run(args.frames))
                d_wall = statistics.median(r.wall_s for r in daemon_runs)
                b_wall = statistics.median(r.wall_s for r in bare_runs)
                d_first = statistics.median(r.first_audio_s for r in daemon_runs)
                b_first = statistics.median(r.first_audio_s for r in bare_runs)
                n = batch * args.frames
                print(f"{batch:>5} {'daemon':>7} {n / d_wall:>9.1f} {d_wall * 1e3:>9.1f} {d_first * 1e3:>13.1f} "
                      f"{(n / d_wall) / (n / b_wall):>12.3f}")
                print(f"{batch:>5} {'bare':>7} {n / b_wall:>9.1f} {b_wall * 1e3:>9.1f} {b_first * 1e3:>13.1f}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.exit(main())
