#!/usr/bin/env python3
"""Streamed text input into the running daemon: first audio and waits at LLM-like token rates.

    .venv/bin/python scripts/bench/stream.py [--rates 5 15 50] [--repeats 3]

Starts jackd (the dummy backend, 24 kHz, 256-frame periods) and the daemon on the built-in tiny
artifact with its speaker on it, so generation is paced by real-time playback the way it is on a
device (`audio.ring_ms` 200 and `audio.ahead_ms` 640: a reply runs at most 0.84 s ahead of what is
heard). The text arrives at each rate as `text` pieces, one token of the talker's own tokenizer
each (what a Qwen LLM, which shares it, streams), after a `speak` with `more_text: true` carrying
the first one. Per rate, median of
`--repeats` runs, greedy, every reply also streamed back (`stream: true`):

- streamed: the time from the first piece to the first `audio` message, and from the piece that
  made the first word certain; the frames that had to wait for their text (`text_wait_frames`), and
  the speaker's underruns during it (a wait that became a gap a listener hears); its frames per
  second of generation;
- whole at once: the same text in one `speak` with the same layout (`more_text` with all of it as the
  first piece, then `final`), first audio from the send;
- wait for the whole text: a client that collects every piece first, then sends it whole: first
  audio measured from the first piece (the stream's duration at that rate + a whole-text speak);
- cohort: the streamed reply beside three whole-text replies (`play: false`, not paced): frames per
  second of the whole cohort and the streamed reply's waits.

Dual-track text is read one token per codec frame, 12.5 tokens/s of audio: text slower than that
makes the reply wait (once it has caught up with the speaker), text faster than that should not.
The daemon holds back the last word until the next piece (it could still grow), so the first audio
of a stream cannot come before the piece after the first word.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, machine, start_jack

sys.path.insert(0, str(ROOT / "tests"))

TEXT = "Sure! The red planet is cold and dry, with a thin atmosphere and dust storms that can cover the whole globe."
GREEDY = {"temperature": 0.0, "top_k": 0, "repetition_penalty": 1.0, "cp_temperature": 0.0, "cp_top_k": 0}
MAX_AUDIO_MS = 6400
"""Every reply is cut there (80 frames; the tiny model seldom reaches eos); the text's 57 tokens fit."""


def pieces(text: str) -> list[str]:
    """The text cut at its own tokens, as a Qwen LLM (which shares the talker's tokenizer) streams it."""
    from edged.artifact import BUILTIN
    from edged.talker.text import TextEncoder

    offsets = TextEncoder(BUILTIN / "tokenizer.json").tokenizer.encode(text, add_special_tokens=False).offsets
    return [text[start:end] for start, end in offsets]


def first_certain(stream_pieces: list[str]) -> int:
    """The index of the piece after which the text's first token is certain (its word is complete)."""
    from edged.artifact import load_artifact
    from edged.families import get_family

    stream = get_family("qwen3_tts").talking(load_artifact()).layout.text_stream()
    return next(i for i, piece in enumerate(stream_pieces) if stream.feed(piece))


def streamed(client, rate: float, stream_pieces: list[str], *, play: bool = True) -> dict:
    """Send the pieces at `rate` per second; first audio from the first piece, and the done report."""
    underruns = client.status()["audio"]["output"]["underruns"]
    t0 = time.perf_counter()
    utterance = client.speak(stream_pieces[0], more_text=True, play=play, stream=True, sampling=GREEDY,
                             max_audio_ms=MAX_AUDIO_MS)
    first = None
    for i, piece in enumerate(stream_pieces[1:], 1):
        while (wait := t0 + i / rate - time.perf_counter()) > 0:
            client.poll()
            first = first or _first_audio(utterance, t0)
            time.sleep(min(wait, 0.002))
        utterance.feed(piece)
    utterance.end()
    for event in utterance:
        if first is None and type(event).__name__ == "Audio":
            first = time.perf_counter() - t0
    first = first or _first_audio(utterance, t0)
    wall = time.perf_counter() - t0
    gaps = client.status()["audio"]["output"]["underruns"] - underruns
    return {"first_audio_s": first, "wall_s": wall, "report": utterance.done.report, "gaps": gaps}


def _first_audio(utterance, t0: float) -> float | None:
    """Pull already-received events; the time of the first audio, if it has come."""
    while utterance.client._inbox.get(utterance.id):
        if type(utterance.next_event()).__name__ == "Audio":
            return time.perf_counter() - t0
    return None


def whole_at_once(client, text: str, delay_s: float = 0.0) -> float:
    """First audio of the text sent in one piece after `delay_s`, measured from before the delay."""
    t0 = time.perf_counter()
    time.sleep(delay_s)
    utterance = client.speak(text, more_text=True, play=True, stream=True, sampling=GREEDY, max_audio_ms=MAX_AUDIO_MS)
    utterance.end()
    first = None
    for event in utterance:
        if first is None and type(event).__name__ == "Audio":
            first = time.perf_counter() - t0
    return first


def cohort(endpoint: str, rate: float, stream_pieces: list[str]) -> tuple[float, int]:
    """The streamed reply (played) beside three whole replies (not played): cohort frames/s, waits."""
    from edged.client import Client

    results: list[dict] = []

    def other(i: int) -> None:
        with Client(endpoint, timeout_s=120) as c:
            results.append(c.speak(TEXT, play=False, sampling=GREEDY, max_audio_ms=MAX_AUDIO_MS).wait().report)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(3)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    with Client(endpoint, timeout_s=120) as c:
        s = streamed(c, rate, stream_pieces)
    for t in threads:
        t.join()
    frames = s["report"]["frames"] + sum(r["frames"] for r in results)
    return frames / (time.perf_counter() - t0), s["report"]["text_wait_frames"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[5.0, 15.0, 50.0], help="text pieces per second")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    jackd = start_jack("edged-stream")
    from support.daemon import Daemon

    from edged.client import Client

    print("\n".join(machine()), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="edged-bench-"))
    daemon = Daemon(tmp, config='[audio]\ndevice = "system"\ninput_device = "none"\nring_ms = 200\nahead_ms = 640\n'
                               '[events]\nlisten = "none"\n')
    stream_pieces = pieces(TEXT)
    certain = first_certain(stream_pieces)
    rows = []
    try:
        with Client(daemon.endpoint, timeout_s=120) as client:
            streamed(client, 50.0, stream_pieces)  # warm-up
            for rate in args.rates:
                runs = [streamed(client, rate, stream_pieces) for _ in range(args.repeats)]
                at_once = [whole_at_once(client, TEXT) for _ in range(args.repeats)]
                duration = (len(stream_pieces) - 1) / rate
                waited_whole = [whole_at_once(client, TEXT, delay_s=duration) for _ in range(args.repeats)]
                cohorts = [cohort(daemon.endpoint, rate, stream_pieces) for _ in range(args.repeats)]
                med = statistics.median
                rows.append({
                    "rate": rate, "first": med(r["first_audio_s"] for r in runs), "certain_at": certain / rate,
                    "at_once": med(at_once), "waited_whole": med(waited_whole),
                    "waits": med(r["report"]["text_wait_frames"] for r in runs), "gaps": med(r["gaps"] for r in runs),
                    "fps": med(r["report"]["frames"] / r["wall_s"] for r in runs),
                    "frames": med(r["report"]["frames"] for r in runs),
                    "cohort_fps": med(c[0] for c in cohorts), "cohort_waits": med(c[1] for c in cohorts)})
                print(f"  {rate:g} tokens/s: {rows[-1]}", flush=True)
    finally:
        daemon.terminate()
        daemon.close()
        jackd.terminate()
        jackd.wait(timeout=10)
    print(f"\n{len(stream_pieces)} pieces ({len(TEXT)} characters; the first token is certain after piece "
          f"{certain + 1}), median of {args.repeats}; times in ms\n")
    print("| text rate | first audio, streamed | of which waiting for the first word | streamed, from the first "
          "word's last piece | whole at once | streamed - at once (from the first word) | waiting for the whole text "
          "| frames waited for text | speaker underruns (gaps heard) | frames | frames/s (streamed reply) | cohort of 4: "
          "frames/s | cohort: frames waited |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        after = r["first"] - r["certain_at"]
        print(f"| {r['rate']:g} tokens/s | {r['first'] * 1e3:.1f} | {r['certain_at'] * 1e3:.1f} | {after * 1e3:.1f} | "
              f"{r['at_once'] * 1e3:.1f} | {(after - r['at_once']) * 1e3:+.1f} | {r['waited_whole'] * 1e3:.1f} | "
              f"{r['waits']:g} | {r['gaps']:g} | {r['frames']:g} | {r['fps']:.1f} | {r['cohort_fps']:.1f} | "
              f"{r['cohort_waits']:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
