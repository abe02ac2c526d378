#!/usr/bin/env python3
"""Time to first audio through each front door vs the daemon's own client, same text, same run.

    python scripts/bench/doors.py [--artifact DIR] [--repeats R] [--threads T]

Starts the daemon (`edged serve`) and both front doors (`edged wyoming`, `edged http`) as
subprocesses, then, R times in turn, sends the same request three ways and times send -> first audio
as the client sees it: the daemon's client over ipc:// (`speak`, stream: true, s16le: the first
`audio` message), Wyoming over TCP (`synthesize`: the first `audio-chunk`), HTTP (POST
/v1/audio/speech, response_format pcm, the first body bytes). Each request is cancelled (or its
connection closed) at its first audio, and the next starts when the daemon is idle again, so every
one runs alone. Prints median and 90th percentile per way and what each door adds (median minus the
daemon client's median).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, start_daemon
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

from edged.client import Audio, Client

TEXT = "Good evening. The front door is locked and the lights are off."
VOICE = "aiden"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_door(tmp: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "edged", *args], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / f"{args[0]}.log", "w"))
    port = int(args[2].rsplit(":", 1)[1])
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / f"{args[0]}.log").read_text()) from None
            time.sleep(0.1)


def via_client(client: Client) -> float:
    sent = time.perf_counter()
    utterance = client.speak(TEXT, voice=VOICE, play=False, stream=True, format="s16le")
    for event in utterance:
        if isinstance(event, Audio):
            first = time.perf_counter() - sent
            utterance.cancel()
            utterance.wait()
            return first
    raise RuntimeError(f"no audio: {utterance.done}")


def via_wyoming(port: int) -> float:
    async def run() -> float:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            sent = time.perf_counter()
            await client.write_event(Synthesize(TEXT, voice=SynthesizeVoice(name=VOICE)).event())
            while True:
                event = await client.read_event()
                if event is None or event.type == "error":
                    raise RuntimeError(f"wyoming: {event}")
                if event.type == "audio-chunk":
                    return time.perf_counter() - sent

    return asyncio.run(run())


def via_http(port: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"model": "tts-1", "input": TEXT, "voice": VOICE, "response_format": "pcm"})
    connection.connect()
    sent = time.perf_counter()
    connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200 or not response.read1(1):
        raise RuntimeError(f"http: {response.status} {response.read()!r}")
    first = time.perf_counter() - sent
    connection.close()
    return first


def idle(client: Client) -> None:
    """Until the daemon has no request running or waiting (the last one's cancel has landed)."""
    while True:
        status = client.status()
        if status["cohort"]["running"] == 0 and status["queue"]["waiting"] == 0:
            return
        time.sleep(0.005)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifact", default=None, help="artifact directory (default: the built-in tiny model)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", default="", metavar="STAGE=N[,STAGE=N...]",
                    help="the daemon's [daemon.threads] (default: its defaults)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-bench-doors-") as tmp_name:
        tmp = Path(tmp_name)
        daemon, endpoint = start_daemon(args.artifact, tmp, args.threads)
        wy_port, http_port = free_port(), free_port()
        doors = [start_door(tmp, "wyoming", "--uri", f"tcp://127.0.0.1:{wy_port}", "--endpoint", endpoint),
                 start_door(tmp, "http", "--listen", f"127.0.0.1:{http_port}", "--endpoint", endpoint)]
        ways = {"daemon client (ipc)": None, "wyoming (tcp)": lambda: via_wyoming(wy_port),
                "http (tcp)": lambda: via_http(http_port)}
        times: dict[str, list[float]] = {name: [] for name in ways}
        try:
            with Client(endpoint, timeout_s=120) as client:
                ways["daemon client (ipc)"] = lambda: via_client(client)
                for round in range(args.repeats + 1):  # the first round warms every path up
                    for name, way in ways.items():
                        idle(client)
                        took = way()
                        if round:
                            times[name].append(took)
                idle(client)
        finally:
            for proc in (*doors, daemon):
                proc.terminate()
                proc.wait(timeout=30)
    print("\n".join(machine()))
    print(f"text: {TEXT!r} voice {VOICE}; {args.repeats} rounds; artifact {args.artifact or 'built-in tiny'}")
    base = statistics.median(times["daemon client (ipc)"])
    print(f"{'way':<22}{'first audio median':>20}{'p90':>10}{'added':>10}")
    for name, t in times.items():
        median, p90 = statistics.median(t), statistics.quantiles(t, n=10)[-1]
        print(f"{name:<22}{median * 1000:>17.1f} ms{p90 * 1000:>7.1f} ms{(median - base) * 1000:>7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
