"""`tests/audio/test_room.py`'s replies replayed offline over many timings: does the reply start the VAD,
and would the listener's near-end gate take that speech for the user (the reply cut by its own echo)?
And how soon is a user heard over the first reply after boot?

    .venv/bin/python scripts/bench/echo_timings.py [--steps boot moved drier back] [--delays 640:1280:16]
        [--offsets 0:224:32] [--latency 768] [--echo-gain 1]
    .venv/bin/python scripts/bench/echo_timings.py --user 10 5 [--user-at 3 0.2] [--delays ...] [--offsets ...]

The reply is test_room's: espeak-ng speech of `support.room.FORECAST` at its VOICE_DBFS, 10 s, played after 1 s of
silence into the room rig's rooms (`tests/support/room.py`: Room(0.5, seed=1); `moved`: someone moved
in it; `drier`: carried into Room(0.25, seed=2); `back`: into the first again), one reply per step,
through one `EchoCanceller` that carries over from step to step as the daemon's does. The canceller is
told `--latency` (the JACK dummy backend's output + input latency) while the echo really arrives
after each of `--delays` samples, and each reply starts `--offsets` samples later than a whole block,
so that every phase of the blocks against the speech is seen: the timings a daemon meets run to run.
The canceller's output goes to the VAD as the listener sends it (soxr to 16 kHz, Silero + the speech
gate at the daemon's defaults), and the listener's barge-in verdict is read as it reads it: on every
VAD frame while the speech gate says speech goes on, at least NEAR_END_SHARE of the canceller's
`near_end` over the last vad.min_speech_ms of blocks.

Per VAD start on a reply: its time into the reply, the gate's margin at the start (the level by which
the canceller's output stood above the echo it expected, in dB, in the NEAR_END_SHARE-th best of
those blocks), and CUT when the verdict held on any frame of that speech (the reply would be cut).

`--user DB ...`: instead, test_room's user (espeak-ng en-us+f2, through the room's user path) speaks
DB below the echo's level at `--user-at` seconds into the first reply after boot; per timing, the ms
from the user's onset at the microphone to the listener's first barge-in verdict, and the verdicts
before the onset (the reply cut by its own echo). Deterministic: the same arguments give the same lines.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine

sys.path[:0] = [str(ROOT / "tests")]

import soxr
from support.patchbay import espeak
from support.room import FORECAST, Room, RoomMic, active_rms, at_voice_level, convolve

from edged.audio.echo import NEAR_DB, EchoCanceller
from edged.audio.listener import NEAR_END_SHARE, RESAMPLE_QUALITY, near_blocks, near_end_met
from edged.audio.vad import SpeechGate, Vad
from edged.config import VadConfig

RATE, BLOCK = 24000, 256
STEPS = ("boot", "moved", "drier", "back")
GAP_S, REPLY_S = 1.0, 10.0
USER = "Wait, stop, I have a question about Thursday."
"""test_room's user (espeak-ng's en-us+f2)."""


class Replay:
    """The listener's path offline: the canceller, soxr to 16 kHz, Silero + the speech gate, and the
    near-end ring the gate reads (NEAR_END_SHARE of the last vad.min_speech_ms of blocks)."""

    def __init__(self, latency: int) -> None:
        cfg = VadConfig()
        self.vad = Vad(cfg.threshold)
        self.gate = SpeechGate(cfg.threshold, min_speech_ms=cfg.min_speech_ms, min_silence_ms=cfg.min_silence_ms)
        self.echo = EchoCanceller(RATE, BLOCK, latency=latency)
        self.resampler = soxr.ResampleStream(RATE, self.vad.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        self.window = near_blocks(cfg.min_speech_ms, RATE, BLOCK)
        self.near = np.zeros(self.window, bool)
        self.out = np.zeros(BLOCK, np.float32)
        self.pending = np.zeros(0, np.float32)
        self.blocks = self.heard = 0

    def block(self, mic: np.ndarray, ref: np.ndarray, heard: bool) -> list[tuple[str | None, bool]]:
        """One block (`heard`: of a reply playing); per VAD frame it completed: (the gate's event, the
        listener's barge-in verdict: speech going on and the near-end share met over a full window of
        the reply's blocks)."""
        self.echo.process(mic, ref, self.out)
        self.near[self.blocks % self.window] = self.echo.near_end()
        self.blocks += 1
        self.heard = self.heard + 1 if heard else 0
        self.pending = np.concatenate([self.pending, self.resampler.resample_chunk(self.out)])
        frames = []
        while len(self.pending) >= self.vad.frame:
            event = self.gate.update(self.vad.probability(self.pending[:self.vad.frame]))
            self.pending = self.pending[self.vad.frame:]
            frames.append((event, self.gate.speaking and near_end_met(self.near, self.heard)))
        return frames

    def margin(self) -> float:
        """The last block's output over the echo the canceller expected in it (dB)."""
        return 10 * np.log10(max(self.echo.out_energy, 1e-30) / max(self.echo.echo_energy, 1e-30))


def walk(reply: np.ndarray, steps: list[str], delay: int, offset: int,
         latency: int, echo_gain: float = 1.0) -> list[list[tuple[float, float, bool]]]:
    """Per step, the VAD starts on its reply: (seconds into the reply, the gate's margin in dB at the
    start, whether the listener's barge-in verdict held on any frame of that speech: the reply cut)."""
    replay = Replay(latency)
    rank = replay.window - int(np.ceil(NEAR_END_SHARE * replay.window))  # sorted ascending: the share's worst block
    line = np.zeros(delay + BLOCK, np.float32)
    mic = RoomMic(Room(0.5, seed=1), BLOCK, seed=0, echo_gain=echo_gain)
    found = []
    for step in steps:
        if step == "moved":
            mic.move()
        elif step != "boot":
            mic = RoomMic(Room(0.25, seed=2) if step == "drier" else Room(0.5, seed=1), BLOCK, seed=0,
                          echo_gain=echo_gain)
        lead = int(GAP_S * RATE) + offset
        play = np.concatenate([np.zeros(lead, np.float32), reply])
        margins, starts = [], []
        for at in range(0, len(play) // BLOCK * BLOCK, BLOCK):
            ref = play[at:at + BLOCK]
            line[:-BLOCK] = line[BLOCK:]
            line[-BLOCK:] = ref
            frames = replay.block(mic(line[:BLOCK]), ref, at >= lead)
            if at >= lead:
                margins.append(replay.margin())
            for event, verdict in frames:
                if event == "start" and len(margins) >= replay.window:
                    starts.append([round((at - lead) / RATE, 2), round(float(np.sort(margins[-replay.window:])[rank]), 1),
                                   False])
                if verdict and starts:  # the listener cuts on any frame of the speech the gate agrees with
                    starts[-1][2] = True
        found.append([tuple(x) for x in starts])
    return found


def barge(reply: np.ndarray, user: np.ndarray, below_db: float, at_s: float, delay: int, offset: int,
          latency: int) -> tuple[float, int]:
    """The first reply after boot, and the user `below_db` under its echo from `at_s` into it (the
    room's user path): ms from the user's onset at the microphone to the listener's barge-in verdict
    (nan: never), and the verdicts before the onset (the reply cut by its own echo)."""
    replay = Replay(latency)
    room = RoomMic(Room(0.5, seed=1), BLOCK, seed=0)
    at_mic = convolve(np.concatenate([user, np.zeros(len(room.paths.user), np.float32)]), room.paths.user)
    room.user.set(room.paths.user * (active_rms(reply) * 10 ** (-below_db / 20) / active_rms(at_mic)), crossfade=False)
    lead = int(GAP_S * RATE) + offset
    said = lead + int(at_s * RATE)
    onset = said + int(np.flatnonzero(np.abs(at_mic) > 0.01 * np.abs(at_mic).max())[0])
    play = np.concatenate([np.zeros(lead, np.float32), reply])
    line = np.zeros(delay + BLOCK, np.float32)
    early = 0
    for at in range(0, len(play) // BLOCK * BLOCK, BLOCK):
        if at == said // BLOCK * BLOCK:
            room.say(user)
        line[:-BLOCK] = line[BLOCK:]
        line[-BLOCK:] = play[at:at + BLOCK]
        for _, verdict in replay.block(room(line[:BLOCK]), play[at:at + BLOCK], at >= lead):
            if verdict and at + BLOCK <= onset:
                early += 1
            elif verdict:
                return (at + BLOCK - onset) * 1000 / RATE, early
    return float("nan"), early


def span(text: str) -> range:
    first, last, step = map(int, text.split(":"))
    return range(first, last + 1, step)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", nargs="+", choices=STEPS, default=["boot"])
    p.add_argument("--delays", type=span, default=span("640:1280:16"), help="FIRST:LAST:STEP samples")
    p.add_argument("--offsets", type=span, default=span("0:224:32"), help="FIRST:LAST:STEP samples")
    p.add_argument("--latency", type=int, default=768, help="the latency the canceller is told (samples)")
    p.add_argument("--echo-gain", type=float, default=1.0,
                   help="the echo's gain at the microphone (10: 20 dB louder, test_room's loud_room)")
    p.add_argument("--user", type=float, nargs="+", metavar="DB",
                   help="instead: the user DB below the echo over the first reply after boot, at each --user-at")
    p.add_argument("--user-at", type=float, nargs="+", default=[3.0, 0.2], metavar="S",
                   help="seconds into the reply the user starts speaking (with --user)")
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        speech = at_voice_level(espeak(FORECAST, Path(tmp)))
        user = espeak(USER, Path(tmp), "en-us+f2")
    reply = np.zeros(int(REPLY_S * RATE), np.float32)
    reply[:min(len(speech), len(reply))] = speech[:len(reply)]
    if args.user:
        return users(reply, user, args)
    timings = starts = cut = 0
    closest = float("-inf")
    for delay in args.delays:
        for offset in args.offsets:
            found = walk(reply, args.steps, delay, offset, args.latency, args.echo_gain)
            timings += 1
            for step, got in zip(args.steps, found):
                for t, margin, taken in got:
                    starts += 1
                    cut += taken
                    closest = max(closest, margin)
                    print(f"delay {delay} offset {offset} {step}: VAD start {t:.2f} s in, gate margin {margin:+.1f} dB"
                          f"{' -> CUT' if taken else ''}", flush=True)
    print(f"\n{timings} timings x steps {' '.join(args.steps)}: {starts} VAD starts on the replies, {cut} taken for the "
          f"user (cut); the closest start stood {closest:+.1f} dB against the gate's {NEAR_DB:.0f} dB" if starts else
          f"\n{timings} timings x steps {' '.join(args.steps)}: no VAD start on the replies")
    return 0


def users(reply: np.ndarray, user: np.ndarray, args) -> int:
    """The --user mode: per level and start, the barge-in verdict's delay after the user's onset."""
    table = []
    for below_db in args.user:
        for at_s in args.user_at:
            heard, early = [], 0
            for delay in args.delays:
                for offset in args.offsets:
                    ms, before = barge(reply, user, below_db, at_s, delay, offset, args.latency)
                    heard.append(ms)
                    early += before
                    print(f"delay {delay} offset {offset} user {below_db:g} dB below at {at_s:g} s: "
                          f"barge-in {ms:.0f} ms after the onset{f', {before} verdicts before it' if before else ''}",
                          flush=True)
            got = [h for h in heard if h == h]
            table.append(f"| {below_db:g} dB below, {at_s:g} s in | {np.median(got):.0f} | {max(got):.0f} | "
                         f"{len(heard) - len(got)} | {early} |" if got else
                         f"| {below_db:g} dB below, {at_s:g} s in | - | - | {len(heard)} | {early} |")
    print(f"\n{len(args.delays) * len(args.offsets)} timings, the first reply after boot\n")
    print("| user | barge-in after the onset, median ms | max ms | never | verdicts before the onset |\n|---|---|---|---|---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
