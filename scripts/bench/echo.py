"""Echo cancellers in simulated rooms: suppression, false barge-ins and how soon a user is heard.

    .venv/bin/python scripts/bench/echo.py [--only edged speex aec3] [--rooms 0.25 0.35 0.5] [--seeds 2]

The daemon's voice is espeak-ng speech (14 s, a different voice per seed) played by a loudspeaker
whose microphone is 6.7 cm away, in a shoebox room with the given reverberation time
(`tests/support/room.py`: pyroomacoustics image-source responses, a mildly clipping loudspeaker,
-62 dBFS microphone noise). The reference reaches the canceller `--bulk` samples (default 768,
the JACK dummy backend's output + input latency) before its echo, as the daemon's listener reads it.
Per room and seed, three runs of every canceller on the same signals:

- far end only: ERLE (mic energy / output energy, after 2 s) and false VAD starts (Silero +
  SpeechGate at the daemon's defaults on the output, resampled to 16 kHz as the listener does),
  with the time of the first one (when the daemon would have cut itself off);
- a path change 6 s in (`Room.responses(moved=True)`): ERLE over the 3 s after it, false starts;
  the same change in the pause between the replies: ERLE over the next reply's first second, its
  false starts; and the device carried into another room in that pause (`SHORTER`, `LONGER`): the same two;
- double talk: a user (espeak-ng, another voice) 5 or 10 dB below the echo starts 3 s in: the VAD's
  start after the user's onset (ms), and the user's attenuation through the canceller (dB: the
  output with the user minus the output without, against the user at the microphone).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine

sys.path[:0] = [str(ROOT / "tests")]

from echo_peers import Aec3, Edged, SingleTap, Speex
from support.room import Room, active_rms, at_voice_level, convolve, loudspeaker, unit

from edged.audio.vad import SpeechGate, Vad

RATE, BLOCK = 24000, 256
FAR_TEXT = ("Here is the forecast for the rest of the week. Tomorrow starts cloudy with a chance of light rain "
            "in the morning, clearing by the afternoon with highs around eighteen degrees. On Thursday the sun "
            "returns, and the weekend looks warm and dry, perfect for a walk in the park or a trip to the lake.")
USER_TEXT = "Wait, stop, I have a question about Thursday."
FAR_VOICES = ["en-us", "en-gb+f3", "en-us+m3", "en-gb"]
USER_VOICES = ["en-us+f2", "en-us+m1", "en-gb+f4", "en-us+m7"]
CANCELLERS = {"edged": Edged, "speex": Speex, "aec3": Aec3, "single-tap": SingleTap}
LEAD = RATE // 2
"""Silence before each reply."""
SHORTER, LONGER = 0.25, 0.5
"""The RT60s of the room the device is carried into between replies: the longer one from a shorter
room, the shorter one from the longest (the rooms' other shapes are seeded apart)."""


def espeak(text: str, voice: str, speed: int = 150) -> np.ndarray:
    import soxr

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text], check=True)
        with wave.open(str(path)) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32767
            rate = w.getframerate()
    return soxr.resample(pcm, rate, RATE).astype(np.float32)


class Scene:
    """The signals of one room and seed: two replies of the far end (the reference) with a pause
    between them, their echo at the microphone (before and after a path change), the user at the
    microphone, the noise. `n`: samples of one reply (0.5 s of silence, the speech, 1.5 s of silence)."""

    def __init__(self, rt60: float, seed: int, bulk: int, noise_dbfs: float = -62.0) -> None:
        far = espeak(FAR_TEXT, FAR_VOICES[seed % len(FAR_VOICES)])
        far = at_voice_level(far)  # the daemon's voice at its active level
        n = self.n = (len(far) + 2 * RATE) // BLOCK * BLOCK
        one = np.zeros(n, np.float32)
        one[LEAD:LEAD + len(far)] = far[:n - LEAD]
        self.ref = np.concatenate([one, one])
        room = Room(rt60, seed=seed)
        paths, moved = room.responses(), room.responses(moved=True)
        speaker = np.concatenate([np.zeros(bulk, np.float32), loudspeaker(self.ref)])[:2 * n]
        self.echo = convolve(speaker, unit(paths.speaker))  # the echo at the reference's level
        self.echo_moved = convolve(speaker, unit(moved.speaker))
        other = Room(LONGER if rt60 < LONGER else SHORTER, seed=seed + 10)
        self.echo_other = convolve(speaker, unit(other.responses().speaker))
        user = espeak(USER_TEXT, USER_VOICES[seed % len(USER_VOICES)])
        at_mic = convolve(np.concatenate([user, np.zeros(RATE // 2, np.float32)]), paths.user)
        self.user = at_mic / active_rms(at_mic) * active_rms(self.echo[RATE:n])
        self.user_onset = int(np.flatnonzero(np.abs(self.user) > 0.01 * np.abs(self.user).max())[0])
        self.noise = np.random.default_rng(seed).standard_normal(2 * n) * 10 ** (noise_dbfs / 20)

    def mic(self, *, move_at: int | None = None, user_db: float | None = None, user_at: int = 0,
            another_room: bool = False) -> np.ndarray:
        echo = self.echo
        if move_at is not None:
            echo = np.concatenate([self.echo[:move_at], (self.echo_other if another_room else self.echo_moved)[move_at:]])
        mic = echo + self.noise
        if user_db is not None:
            end = min(len(mic), user_at + len(self.user))
            mic[user_at:end] += self.user[:end - user_at] * 10 ** (-user_db / 20)
        return mic.astype(np.float32)


def cancel(make, mic: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, float]:
    """Runs a canceller over the signals; returns its output (aligned to the input) and the mean cost
    of a block in microseconds."""
    c = make()
    out = np.zeros(len(mic) + BLOCK, np.float32)
    start = time.process_time()
    for i in range(0, len(mic), BLOCK):
        out[i:i + BLOCK] = c.process(mic[i:i + BLOCK], ref[i:i + BLOCK])
    cost = (time.process_time() - start) / (len(mic) // BLOCK) * 1e6
    return out[c.delay:c.delay + len(mic)], cost


def vad_starts(out: np.ndarray) -> list[float]:
    """Seconds at which the daemon's VAD (at its defaults) would start on this output."""
    import soxr

    from edged.config import VadConfig

    cfg = VadConfig()
    vad, gate = Vad(cfg.threshold), SpeechGate(cfg.threshold, min_speech_ms=cfg.min_speech_ms, min_silence_ms=cfg.min_silence_ms)
    pcm = soxr.resample(out, RATE, 16000, quality="LQ").astype(np.float32)
    starts = []
    for i in range(0, len(pcm) - vad.frame + 1, vad.frame):
        if gate.update(vad.probability(pcm[i:i + vad.frame])) == "start":
            starts.append((i + vad.frame) / 16000)
    return starts


def erle(mic: np.ndarray, out: np.ndarray, span: slice) -> float:
    return float(10 * np.log10(np.sum(mic[span].astype(np.float64) ** 2) / (np.sum(out[span].astype(np.float64) ** 2) + 1e-20)))


def heard_ms(out: np.ndarray, onset: int) -> float:
    """The VAD's first start after the user's onset (sample), in ms; nan when never."""
    heard = [t for t in vad_starts(out) if t > onset / RATE]
    return (heard[0] - onset / RATE) * 1000 if heard else float("nan")


def measure(make, scene: Scene) -> dict[str, float]:
    row: dict[str, float] = {}
    n = scene.n
    still = scene.mic()
    quiet, row["cost_us"] = cancel(make, still, scene.ref)
    row["erle_db"] = erle(still, quiet, slice(2 * RATE, n))
    starts = [t for t in vad_starts(quiet) if t < n / RATE]
    row["false_starts"] = len(starts)
    row["first_false_s"] = starts[0] - LEAD / RATE if starts else float("nan")  # from the reply's start

    move = 6 * RATE  # mid-reply
    mic = scene.mic(move_at=move)
    out, _ = cancel(make, mic, scene.ref)
    row["erle_moved_db"] = erle(mic, out, slice(move, move + 3 * RATE))
    row["false_starts_moved"] = len([t for t in vad_starts(out) if t < n / RATE])
    move = n - RATE // 2  # in the pause between the replies: the next reply meets a new path
    mic = scene.mic(move_at=move)
    out, _ = cancel(make, mic, scene.ref)
    row["erle_next_db"] = erle(mic, out, slice(n + LEAD, n + LEAD + RATE))
    row["false_starts_next"] = len([t for t in vad_starts(out) if t > n / RATE])
    mic = scene.mic(move_at=move, another_room=True)  # carried into another room between the replies
    out, _ = cancel(make, mic, scene.ref)
    row["erle_room_db"] = erle(mic, out, slice(n + LEAD, n + LEAD + RATE))
    row["false_starts_room"] = len([t for t in vad_starts(out) if t > n / RATE])

    for user_db in (5, 10):
        at = 3 * RATE + LEAD
        mic = scene.mic(user_db=user_db, user_at=at)
        out, _ = cancel(make, mic, scene.ref)
        row[f"heard_ms_{user_db}"] = heard_ms(out[:n], at + scene.user_onset)
        span = slice(at, at + len(scene.user))
        row[f"user_loss_db_{user_db}"] = erle(mic[span] - still[span], out[span] - quiet[span], slice(None))
        after = slice(span.stop, span.stop + RATE)  # the echo in the second after the user stopped
        row[f"after_user_db_{user_db}"] = erle(mic, out, after) - erle(still, quiet, after)
    for reply, name in ((0, "start_cold"), (n, "start_warm")):  # the user talks over a reply's start
        at = reply + LEAD + RATE // 5 - scene.user_onset
        mic = scene.mic(user_db=5, user_at=at)
        out, _ = cancel(make, mic, scene.ref)
        row[f"heard_ms_{name}"] = heard_ms(out, at + scene.user_onset)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", default=list(CANCELLERS), choices=list(CANCELLERS))
    p.add_argument("--rooms", nargs="+", type=float, default=[0.25, 0.35, 0.5])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--bulk", type=int, default=768, help="samples the reference leads its echo by")
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    keys = ["erle_db", "false_starts", "first_false_s", "erle_moved_db", "false_starts_moved", "erle_next_db",
            "false_starts_next", "erle_room_db", "false_starts_room", "heard_ms_5", "user_loss_db_5", "after_user_db_5",
            "heard_ms_10", "user_loss_db_10", "after_user_db_10", "heard_ms_start_cold", "heard_ms_start_warm", "cost_us"]
    table: dict[str, list[dict[str, float]]] = {name: [] for name in args.only}
    for rt60 in args.rooms:
        for seed in range(args.seeds):
            scene = Scene(rt60, seed, args.bulk)
            for name in args.only:
                row = measure(lambda name=name: CANCELLERS[name](RATE, BLOCK, bulk=args.bulk), scene)
                table[name].append(row)
                print(f"rt60 {rt60} seed {seed} {name:6s} " + " ".join(f"{k} {row[k]:.1f}" for k in keys), flush=True)
    print(f"\n{args.seeds} seeds x rooms {args.rooms}; median (min .. max)")
    print("| canceller | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, rows in table.items():
        cells = []
        for k in keys:
            v = [r[k] for r in rows if r[k] == r[k]]
            missing = len(rows) - len(v)
            cell = f"{statistics.median(v):.1f} ({min(v):.1f} .. {max(v):.1f})" if v else "-"
            if k.startswith("false_starts"):
                cell = f"{int(sum(v))} in {len(rows)}"
            elif missing:
                cell += f", {missing} never"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
