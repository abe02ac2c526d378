"""`tests/audio/test_room.py`'s replies replayed offline over many timings: does the reply start the VAD,
and would the listener's near-end gate take that start for the user (the reply cut by its own echo)?

    .venv/bin/python scripts/bench/echo_timings.py [--steps boot moved drier back] [--delays 640:1280:16]
        [--offsets 0:224:32] [--latency 768]

The reply is test_room's: espeak-ng speech of `support.room.FORECAST` at its VOICE_DBFS, 10 s, played after 1 s of
silence into the room rig's rooms (`tests/support/room.py`: Room(0.5, seed=1); `moved`: someone moved
in it; `drier`: carried into Room(0.25, seed=2); `back`: into the first again), one reply per step,
through one `EchoCanceller` that carries over from step to step as the daemon's does. The canceller is
told `--latency` (the JACK dummy backend's output + input latency) while the echo really arrives
after each of `--delays` samples, and each reply starts `--offsets` samples later than a whole block,
so that every phase of the blocks against the speech is seen: the timings a daemon meets run to run.
The canceller's output goes to the VAD as the listener sends it (soxr to 16 kHz, Silero + the speech
gate at the daemon's defaults), and the gate reads the canceller's `near_end` over the last
vad.min_speech_ms of blocks as the listener does (NEAR_END_SHARE of them).

Per VAD start on a reply: its time into the reply, and the gate's margin: the level by which the
canceller's output stood above the echo it expected (dB) in the NEAR_END_SHARE-th best of those blocks;
the gate takes the start for the user (the reply would be cut) at NEAR_DB and above. Deterministic:
the same arguments give the same lines.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT

sys.path[:0] = [str(ROOT / "tests")]

import soxr
from support.patchbay import espeak
from support.room import FORECAST, Room, RoomMic, at_voice_level

from edged.audio.echo import NEAR_DB, EchoCanceller
from edged.audio.listener import NEAR_END_SHARE, RESAMPLE_QUALITY, near_blocks
from edged.audio.vad import SpeechGate, Vad
from edged.config import VadConfig

RATE, BLOCK = 24000, 256
STEPS = ("boot", "moved", "drier", "back")
GAP_S, REPLY_S = 1.0, 10.0


def walk(reply: np.ndarray, steps: list[str], delay: int, offset: int, latency: int) -> list[list[tuple[float, float]]]:
    """Per step, the VAD starts on its reply: (seconds into the reply, the gate's margin in dB)."""
    cfg = VadConfig()
    vad = Vad(cfg.threshold)
    gate = SpeechGate(cfg.threshold, min_speech_ms=cfg.min_speech_ms, min_silence_ms=cfg.min_silence_ms)
    echo = EchoCanceller(RATE, BLOCK, latency=latency)
    resampler = soxr.ResampleStream(RATE, vad.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
    window = near_blocks(cfg.min_speech_ms, RATE, BLOCK)
    rank = window - int(np.ceil(NEAR_END_SHARE * window))  # sorted ascending: the share's worst block
    line = np.zeros(delay + BLOCK, np.float32)
    out = np.zeros(BLOCK, np.float32)
    pending = np.zeros(0, np.float32)
    mic = RoomMic(Room(0.5, seed=1), BLOCK, seed=0)
    found = []
    for step in steps:
        if step == "moved":
            mic.move()
        elif step != "boot":
            mic = RoomMic(Room(0.25, seed=2) if step == "drier" else Room(0.5, seed=1), BLOCK, seed=0)
        lead = int(GAP_S * RATE) + offset
        play = np.concatenate([np.zeros(lead, np.float32), reply])
        margins, starts = [], []
        for at in range(0, len(play) // BLOCK * BLOCK, BLOCK):
            ref = play[at:at + BLOCK]
            line[:-BLOCK] = line[BLOCK:]
            line[-BLOCK:] = ref
            echo.process(mic(line[:BLOCK]), ref, out)
            if at >= lead:
                margins.append(10 * np.log10(max(echo.out_energy, 1e-30) / max(echo.echo_energy, 1e-30)))
            pending = np.concatenate([pending, resampler.resample_chunk(out)])
            while len(pending) >= vad.frame:
                event = gate.update(vad.probability(pending[:vad.frame]))
                pending = pending[vad.frame:]
                if event == "start" and len(margins) >= window:
                    starts.append((round((at - lead) / RATE, 2), round(float(np.sort(margins[-window:])[rank]), 1)))
        found.append(starts)
    return found


def span(text: str) -> range:
    first, last, step = map(int, text.split(":"))
    return range(first, last + 1, step)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", nargs="+", choices=STEPS, default=["boot"])
    p.add_argument("--delays", type=span, default=span("640:1280:16"), help="FIRST:LAST:STEP samples")
    p.add_argument("--offsets", type=span, default=span("0:224:32"), help="FIRST:LAST:STEP samples")
    p.add_argument("--latency", type=int, default=768, help="the latency the canceller is told (samples)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        speech = at_voice_level(espeak(FORECAST, Path(tmp)))
    reply = np.zeros(int(REPLY_S * RATE), np.float32)
    reply[:min(len(speech), len(reply))] = speech[:len(reply)]
    timings = starts = cut = 0
    closest = float("-inf")
    for delay in args.delays:
        for offset in args.offsets:
            found = walk(reply, args.steps, delay, offset, args.latency)
            timings += 1
            for step, got in zip(args.steps, found):
                for t, margin in got:
                    starts += 1
                    cut += margin >= NEAR_DB
                    closest = max(closest, margin)
                    print(f"delay {delay} offset {offset} {step}: VAD start {t:.2f} s in, gate margin {margin:+.1f} dB"
                          f"{' -> CUT' if margin >= NEAR_DB else ''}", flush=True)
    print(f"\n{timings} timings x steps {' '.join(args.steps)}: {starts} VAD starts on the replies, {cut} taken for the "
          f"user (cut); the closest stood {closest:+.1f} dB against the gate's {NEAR_DB:.0f} dB" if starts else
          f"\n{timings} timings x steps {' '.join(args.steps)}: no VAD start on the replies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
