"""Barge-in latency and cursor error of the real daemon on a real audio server (JACK dummy, 24 kHz).

    .venv/bin/python scripts/bench/bargein.py [--runs 8]

Starts jackd (dummy backend, 256-frame periods), the daemon on the built-in tiny artifact, and a
JACK client that records the daemon's output port and plays espeak-ng speech into its input port
together with the daemon's own output (a loopback, as a room mixes them). Per run, one reply plays,
speech starts 1.0-2.0 s into it, and the script measures on the JACK clock:

- onset -> silence: the speech's first sample on the input port to the reply's last sample on the
  output port (what a listener experiences);
- VAD decision: the onset to the VAD's start decision, both on the daemon's published mic audio;
- cut: onset -> silence minus the decision (the path from the decision to the speaker);
- played_ms error: the `done` report's played_ms vs the samples recorded on the output port;
- cursor error: `status`'s live cursor mid-reply vs the recording moved to the DAC (latency L).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, start_jack

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "audio")]

VOICES = ["en-us", "en-gb", "en-us+f3", "de", "fr", "en-us+m3"]
PHRASES = ["Stop! Please stop talking now.", "Wait a moment.", "No, that is not what I asked.",
           "Hey, hold on.", "Excuse me, can you repeat that?", "Okay, thanks, that is enough."]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8)
    args = p.parse_args()
    jackd = start_jack("edged-bench")
    name = os.environ["JACK_DEFAULT_SERVER"]
    from support.daemon import Daemon
    from support.patchbay import Patchbay, Subscriber, espeak, quiet
    from test_daemon_audio import PERIOD, RATE, TEXT, heard, reply_start

    from edged.client import Client

    tmp = Path(tempfile.mkdtemp(prefix="edged-bench-"))
    events = f"ipc://{tmp / 'events.sock'}"
    daemon = Daemon(tmp, config=f'[events]\nlisten = "{events}"\n[audio]\ndevice = "system"\ninput_device = "system"\n')
    bay, sub = Patchbay(name), Subscriber(events)
    rows: list[dict[str, float]] = []
    try:
        client = Client(daemon.endpoint)
        bay.patch(record=True, voice=True, loopback=True)
        rng = np.random.default_rng(0)
        for run in range(args.runs):
            voice, phrase = VOICES[run % len(VOICES)], PHRASES[run % len(PHRASES)]
            speech = espeak(phrase, tmp, voice)
            quiet(client)  # the last run's user has stopped (else the reply is cut as soon as it is heard)
            sub.clear()
            mark = bay.mark()
            utt = client.speak(TEXT, stream=True, max_audio_ms=6000)
            time.sleep(0.9)
            before, status, after = bay.mark(), client.status(), bay.mark()
            time.sleep(float(rng.uniform(0.1, 1.1)))
            said_at = sub.of("mic")[-1]["first_sample"]
            bay.say(speech)
            done = utt.wait()
            while bay.voice_pos < len(speech):  # the user finishes speaking before the next run
                time.sleep(0.05)
            time.sleep(0.6)
            start = reply_start(bay.rec, mark)
            n = heard(bay.rec, start, utt.pcm)
            replies = status["audio"]["output"]["replies"]
            cursor = replies[0]["played_ms"] * RATE // 1000 if replies else float("nan")
            mid = (before + after) / 2 - start - 2 * PERIOD  # recording position moved to the DAC
            vad = [e for e in sub.of("vad") if e["state"] == "start"]
            mic = sub.mic_audio()
            first = sub.of("mic")[0]["first_sample"]
            onset16 = said_at + int(np.flatnonzero(np.abs(mic[said_at - first:]) > 0.02)[0])
            onset = bay.voice_start + int(np.flatnonzero(np.abs(speech) > 0.02)[0])
            row = {"reason_ok": float(done.reason == "interrupted"),
                   "onset_to_silence_ms": (start + n - onset) / RATE * 1000,
                   "decision_ms": (vad[0]["mic_sample"] - onset16) / 16 if vad else float("nan"),
                   "played_ms_error_samples": done.report["played_ms"] * RATE / 1000 - n,
                   "cursor_error_samples": cursor - mid}
            row["cut_ms"] = row["onset_to_silence_ms"] - row["decision_ms"]
            rows.append(row)
            print(f"run {run} ({voice}, {phrase!r}): " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
        client.close()
    finally:
        sub.close()
        daemon.terminate()
        daemon.close()
        bay.close()
        jackd.terminate()
        jackd.wait(10)
    print(f"\n{len(rows)} runs, JACK dummy 24 kHz, period {PERIOD} frames ({PERIOD / RATE * 1000:.1f} ms)")
    for key in ("onset_to_silence_ms", "decision_ms", "cut_ms", "played_ms_error_samples", "cursor_error_samples"):
        values = [r[key] for r in rows if r[key] == r[key]]
        print(f"  {key:26s} median {statistics.median(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f}")
    print(f"  interrupted: {sum(r['reason_ok'] for r in rows):.0f}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
