#!/usr/bin/env python3
"""The voice loop's own share of a turn (`edged converse`, edged/converse/loop.py), on the room rig:
end of speech -> end of turn decided, and the LLM's first token -> the answer's first audio at the
speaker, median and p95 over repeated turns.

    python scripts/bench/converse.py [--turns 12] [--end-silence-ms 600]

The daemon (the built-in tiny model, its voice espeak-ng speech: tests/support/voiced.py) on a JACK
dummy server in a simulated room (RT60 0.5 s, tests/support/room.py), a scripted user (espeak-ng)
asking 5 dB under the daemon's voice, a local transcription server answering at once and a local
LLM streaming a short answer (a piece every 30 ms): what is measured is the loop and the daemon, not
the endpoints. Each turn waits for the previous answer to finish playing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, machine, start_jack, stop_jack

sys.path[:0] = [str(ROOT / "tests")]

QUESTION = "What is the weather like on Mars today?"
ANSWER = ["Mars", " is", " cold", " and", " dry", ",", " with", " thin", " air", "."]


def until(what, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError("the turn did not finish in time")
        time.sleep(0.05)


def turns(args: argparse.Namespace, server: str, tmp: Path) -> list:
    from support.barge import speaking_room
    from support.completions import completions_server, content
    from support.patchbay import quiet
    from support.room import Room, active_rms, at_voice_level
    from support.transcription import Answer, transcription_server

    from edged.converse.loop import Converse, Settings

    with speaking_room(server, tmp, Room(0.5, seed=1), QUESTION) as room, transcription_server() as asr, \
            completions_server() as llm:
        asr.answer = Answer(body=json.dumps({"text": QUESTION}).encode())
        llm.answers = [content(ANSWER)]
        converse = Converse(Settings(asr.url, "whisper-1", llm.url, "tiny", session="bench",
                                     end_silence_ms=args.end_silence_ms, endpoint=room.daemon.endpoint),
                            say=lambda line: print(line, flush=True))
        stop = threading.Event()
        listening = threading.Thread(target=converse.run, args=(stop,))
        listening.start()
        try:
            time.sleep(1.0)
            level = active_rms(at_voice_level(room.user))
            for n in range(args.turns):
                quiet(room.client, room.rig)
                room.rig.say(room.user, 5, level)
                until(lambda n=n: converse.answered > n, 120)
                until(lambda: room.client.status()["playing"] == 0, 60)
        finally:
            stop.set()
            listening.join(60)
        return converse.timings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--end-silence-ms", type=int, default=600)
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    jackd = start_jack("edged-bench")
    try:
        timings = turns(args, os.environ["JACK_DEFAULT_SERVER"], Path(tempfile.mkdtemp(prefix="edged-bench-converse-")))
    finally:
        stop_jack(jackd)
    parts = {"end of speech -> turn decided": [t.decided_ms for t in timings],
             "first LLM token -> first audio": [t.first_audio_ms - t.first_token_ms for t in timings
                                                if t.first_audio_ms is not None and t.first_token_ms is not None],
             "end of speech -> first audio (endpoints answering at once)": [
                 t.first_audio_ms for t in timings if t.first_audio_ms is not None]}
    print(f"\n{len(timings)} turns, end silence {args.end_silence_ms} ms\n")
    print("| the loop's share | median ms | p95 ms | turns |\n|---|---|---|---|")
    for name, ms in parts.items():
        print(f"| {name} | {statistics.median(ms):.0f} | {np.percentile(ms, 95):.0f} | {len(ms)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
