"""Where a barge-in's time goes, offline: scripts/bench/bargein.py's users over a spoken reply,
replayed through the listener's path (scripts/bench/echo_timings.py `Replay`: the canceller, soxr,
Silero + the speech gate, the near-end ring), with the VAD alone on each user as the floor.

    .venv/bin/python scripts/bench/bargein_parts.py [--at 2.7 3.3] [--below 5 10]

Per user (bargein.py's six espeak-ng voices and phrases), room (RT60 0.5 s and 0.25 s, bargein.py's
seeds) and SER: a reply of `support.room.FORECAST` plays once alone (the canceller converges), then
again with the user starting `--at` seconds into it, `--below` dB under the echo. Printed, in ms after
the user's onset at the microphone: `alone`, the VAD's start on the same user at the same level with no reply (nan: never);
`gate`, the first block at which the near-end share is met; `vad`, the VAD's first start;
`verdict`, the listener's first barge-in verdict (speech going on and the share met). The daemon adds
the speaker's stop and its DAC latency to `verdict` (bargein.py measures the whole). Deterministic.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bargein import PHRASES, ROOM_SEEDS, VOICES
from common import ROOT, machine

sys.path[:0] = [str(ROOT / "tests")]

from echo_timings import BLOCK, RATE, Replay
from support.patchbay import espeak
from support.room import FORECAST, Room, RoomMic, active_rms, at_voice_level, convolve

from edged.audio.listener import near_end_met

LATENCY = 768
"""The echo's delay and the latency the canceller is told (the JACK dummy backend's, in samples)."""


def onset_of(room: RoomMic, user: np.ndarray) -> tuple[np.ndarray, int]:
    """The user as the microphone hears it (through the room's user path), and its onset there."""
    at_mic = convolve(np.concatenate([user, np.zeros(len(room.paths.user), np.float32)]), room.paths.user)
    return at_mic, int(np.flatnonzero(np.abs(at_mic) > 0.01 * np.abs(at_mic).max())[0])


def over_reply(reply: np.ndarray, user: np.ndarray, rt60: float, below: float, at_s: float) -> dict[str, float]:
    replay = Replay(LATENCY)
    room = RoomMic(Room(rt60, seed=ROOM_SEEDS[rt60]), BLOCK, seed=0)
    line = np.zeros(LATENCY + BLOCK, np.float32)
    found: dict[str, float] = {}

    def play(pcm: np.ndarray, say_at: int | None, onset: int) -> None:
        for at in range(0, len(pcm) // BLOCK * BLOCK, BLOCK):
            if at == say_at:
                room.say(user)
            line[:-BLOCK] = line[BLOCK:]
            line[-BLOCK:] = pcm[at:at + BLOCK]
            frames = replay.block(room(line[:BLOCK]), pcm[at:at + BLOCK], at >= RATE)
            t = (at + BLOCK - onset) * 1000 / RATE
            if say_at is None or t < 0:
                continue
            if near_end_met(replay.near, replay.heard):
                found.setdefault("gate", t)
            for event, verdict in frames:
                if event == "start":
                    found.setdefault("vad", t)
                if verdict:
                    found.setdefault("verdict", t)

    pcm = np.concatenate([np.zeros(RATE, np.float32), reply])
    play(pcm, None, 0)
    at_mic, onset = onset_of(room, user)
    room.user.set(room.paths.user * (active_rms(reply) * 10 ** (-below / 20) / active_rms(at_mic)), crossfade=False)
    said = (RATE + int(at_s * RATE)) // BLOCK * BLOCK
    play(pcm, said, said + onset)
    return found


def alone(reply: np.ndarray, user: np.ndarray, rt60: float, below: float) -> float:
    """ms from the onset to the VAD's start on the user at the same level with no reply (through the
    listener's path as between replies)."""
    replay = Replay(LATENCY)
    room = RoomMic(Room(rt60, seed=ROOM_SEEDS[rt60]), BLOCK, seed=0, echo_gain=0.0)
    at_mic, onset = onset_of(room, user)
    room.user.set(room.paths.user * (active_rms(reply) * 10 ** (-below / 20) / active_rms(at_mic)), crossfade=False)
    said = RATE // 2 // BLOCK * BLOCK
    silence = np.zeros(BLOCK, np.float32)
    for at in range(0, 3 * RATE, BLOCK):
        if at == said:
            room.say(user)
        for event, _ in replay.block(room(silence), silence, False):
            if event == "start":
                return (at + BLOCK - said - onset) * 1000 / RATE
    return float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--at", type=float, nargs="+", default=[2.7, 3.3], help="seconds into the reply the user starts")
    p.add_argument("--below", type=float, nargs="+", default=[5.0, 10.0], help="dB under the echo")
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        reply = at_voice_level(espeak(FORECAST, Path(tmp)))[:10 * RATE]
        users = [espeak(phrase, Path(tmp), voice) for voice, phrase in zip(VOICES, PHRASES)]
    rows: dict[str, list[float]] = {"alone": [], "gate": [], "vad": [], "verdict": []}
    for rt60 in ROOM_SEEDS:
        for (voice, phrase), user in zip(zip(VOICES, PHRASES), users):
            for below in args.below:
                floor = alone(reply, user, rt60, below)
                for at_s in args.at:
                    rows["alone"].append(floor)
                    got = over_reply(reply, user, rt60, below, at_s)
                    for key in ("gate", "vad", "verdict"):
                        rows[key].append(got.get(key, float("nan")))
                    print(f"rt60 {rt60} {voice:9s} {phrase[:24]:24s} -{below:g} dB at {at_s:g} s: alone {floor:4.0f}  "
                          + "  ".join(f"{k} {got.get(k, float('nan')):4.0f}" for k in ("gate", "vad", "verdict")), flush=True)
    print()
    for key, values in rows.items():
        heard = [v for v in values if v == v]
        print(f"{key:8s} ms after the onset: median {statistics.median(heard):4.0f}  p90 {np.percentile(heard, 90):4.0f}"
              f"  max {max(heard):4.0f}  ({len(heard)} of {len(values)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
