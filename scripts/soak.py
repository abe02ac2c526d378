#!/usr/bin/env python3
"""Soak: hundreds of mixed requests through the real daemon; its memory, file descriptors and threads
at the start and at the end.

    python scripts/soak.py [--requests 600] [--clients 4] [--seed 0] [--artifact DIR]

Boots `edged serve` as a subprocess (no audio devices, no event socket, its own history file), warms
it up with one round of every kind, measures the daemon's resident memory (VmRSS), open file
descriptors and threads, then runs the requests from `--clients` threads in a seeded order:
- whole: a speak, streamed back or not, 80-800 ms of audio, some with a history session;
- streamed text: a speak with more_text, its text fed in pieces, then ended;
- cancelled: a long speak cancelled after its first audio;
- vanishing: a raw socket sends a streamed speak, reads one reply and closes (the client is gone);
- history: a user turn and a history query.
Halfway, once the daemon is idle, it measures again, and again at the end: it prints the three, the
growth, the second half's growth per request (levelling off: small, and not growing with the run),
and each kind's count and `done` reasons. `soak()` is what tests/daemon/test_soak.py runs, shorter.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import msgpack
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.client import Client

KINDS = ("whole", "streamed", "cancelled", "vanishing", "history")
TEXT = "The soak keeps the daemon busy with one more sentence."


def measure(pid: int) -> dict[str, int]:
    """The process's resident memory (bytes), open file descriptors and threads."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
    return {"rss": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task"))}


def run_one(endpoint: str, kind: str, rng: random.Random, n: int) -> str:
    """One request of `kind`; its done reason (or what ended it)."""
    if kind == "vanishing":
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(msgpack.packb({"op": "speak", "id": f"gone{n}", "text": TEXT, "play": False, "stream": True,
                                 "max_audio_ms": 8000}))
        sock.poll(10000)
        sock.close()
        return "vanished"
    with Client(endpoint, timeout_s=120) as client:
        if kind == "whole":
            session = f"s{n % 5}" if rng.random() < 0.3 else None
            return client.speak(TEXT, play=False, stream=rng.random() < 0.5, session=session,
                                max_audio_ms=rng.randrange(80, 800)).wait().reason
        if kind == "streamed":
            utterance = client.speak("Streamed in", play=False, more_text=True, max_audio_ms=1600)
            for piece in (" pieces,", " as an", " LLM", " writes."):
                utterance.feed(piece)
            utterance.end()
            return utterance.wait().reason
        if kind == "cancelled":
            utterance = client.speak(TEXT, play=False, stream=True, max_audio_ms=30000)
            next(e for e in utterance if type(e).__name__ == "Audio")
            utterance.cancel()
            return utterance.wait().reason
        client.turn(f"s{n % 5}", "user", "A user turn.")
        client.history(f"s{n % 5}")
        return "history"


def run_all(endpoint: str, jobs: list[tuple[str, int]], clients: int, seed: int) -> Counter:
    """The jobs from `clients` threads; (kind, outcome) counts."""
    outcomes: Counter = Counter()
    lock = threading.Lock()
    queue = list(jobs)

    def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        while True:
            with lock:
                if not queue:
                    return
                kind, n = queue.pop()
            outcome = run_one(endpoint, kind, rng, n)
            with lock:
                outcomes[kind, outcome] += 1

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def idle(endpoint: str, timeout: float = 60) -> None:
    """Wait until nothing runs, waits or plays."""
    deadline = time.monotonic() + timeout
    with Client(endpoint, timeout_s=30) as client:
        while True:
            s = client.status()
            if not s["cohort"]["running"] and not s["queue"]["waiting"] and not s["playing"]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the daemon is still busy after {timeout} s: {s['cohort']}")
            time.sleep(0.1)


def soak(endpoint: str, pid: int, requests: int, clients: int, seed: int) -> dict:
    """Warm up, measure, run the first half of `requests` mixed requests, wait until idle, measure,
    the second half, wait until idle, measure: the second half's growth is what levelling off means."""
    rng = random.Random(seed)
    run_all(endpoint, [(kind, i) for i, kind in enumerate(KINDS * 2)], clients, seed)  # warm-up: every kind
    idle(endpoint)
    start = measure(pid)
    jobs = [(rng.choice(KINDS), i) for i in range(requests)]
    t0 = time.monotonic()
    outcomes = run_all(endpoint, jobs[:requests // 2], clients, seed)
    idle(endpoint)
    half = measure(pid)
    outcomes += run_all(endpoint, jobs[requests // 2:], clients, seed + 1)
    idle(endpoint)
    time.sleep(0.5)
    return {"start": start, "half": half, "end": measure(pid), "outcomes": outcomes,
            "seconds": time.monotonic() - t0}


def start_daemon(tmp: Path, artifact: str | None) -> tuple[subprocess.Popen, str]:
    endpoint = f"ipc://{tmp / 'edged.sock'}"
    (tmp / "edged.toml").write_text(
        f'[daemon]\nqueue_limit = 64\n{f"artifact = {artifact!r}" if artifact else ""}\n'
        f'[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n'
        f'[history]\npath = "{tmp / "history.sqlite3"}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(tmp / "edged.toml"),
                             "--listen", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp / "edged.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc, endpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--artifact", default=None, help="default: the built-in tiny artifact")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint = start_daemon(Path(tmp), args.artifact)
        try:
            result = soak(endpoint, proc.pid, args.requests, args.clients, args.seed)
        finally:
            proc.terminate()
            code = proc.wait(timeout=60)
    start, end = result["start"], result["end"]
    print(f"command: python {' '.join(sys.argv)}")
    print(f"{args.requests} requests from {args.clients} clients in {result['seconds']:.1f} s; daemon exit {code}\n")
    half, second = result["half"], args.requests - args.requests // 2
    print("| | start | after half | end | growth | second half, per request |\n|---|---|---|---|---|---|")
    mib = [m["rss"] / 2**20 for m in (start, half, end)]
    kib = (end["rss"] - half["rss"]) / 1024 / second
    print(f"| resident MiB | {mib[0]:.1f} | {mib[1]:.1f} | {mib[2]:.1f} | {mib[2] - mib[0]:+.1f} | {kib:+.2f} KiB |")
    for key in ("fds", "threads"):
        print(f"| {key} | {start[key]} | {half[key]} | {end[key]} | {end[key] - start[key]:+d} | |")
    print("\n| kind | outcome | count |\n|---|---|---|")
    for (kind, outcome), count in sorted(result["outcomes"].items()):
        print(f"| {kind} | {outcome} | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
