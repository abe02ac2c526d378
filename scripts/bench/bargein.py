"""Barge-in on a real audio server (JACK dummy, 24 kHz, 256-frame periods): through simulated rooms,
and through a wire.

    .venv/bin/python scripts/bench/bargein.py [--room-runs 4] [--wire-runs 8] [--only room wire]
        [--alone-runs 6] [--voices speech babble] [--rooms 0.5 0.25] [--users 5dB-3s 10dB-3s 5dB-start]
        [--load idle|one|two|two+memory|heavy] [--no-realtime]

Load (tests/support/load.py), started once the daemon and the room are up, at the default priority:
`one` / `two` spinning processes, `two+memory` two spinning and two memory-bound (LLM-like), `heavy`
eight spinning and two memory-bound. By default jackd runs real-time (-R) and the daemon's audio
threads ask for SCHED_FIFO (audio.realtime_priority 5); `--no-realtime`: neither (jackd
--no-realtime, audio.realtime_priority = 0: how every figure in docs/dev/echo.md recorded before
the audio threads asked for real time was taken). Each row also reports the daemon's speaker
underruns and the listener's largest lag (`status.audio.input.behind_max_ms`) over it.

Room (tests/support/room_rig.py, as tests/audio/test_room.py): the daemon's output goes through a
room into its own microphone (6.7 cm from the loudspeaker, reverberation 0.25 and 0.5 s, a mildly
clipping loudspeaker, -62 dBFS microphone noise, the device's DAC and ADC latency). Its voice is
espeak-ng speech standing in for the PCM at the speaker's input (tests/support/voiced.py), and
then the built-in model's babble. Per voice and room, on the JACK clock:

- replies of 10 s with no user: how many the daemon cut itself (`interrupted`), false VAD starts,
  and the canceller's ERLE (`status`) at the end: the first reply after boot or after entering the
  room, the first after someone moved (a path change between replies), and more, `--alone-runs` in
  all;
- `--room-runs` runs of each user case (espeak-ng, 6 voices and phrases): 5 and 10 dB below the
  echo, starting 2.5-3.5 s into a reply, and 5 dB below it 0.1-0.3 s into a reply (`--users`): the
  user's onset at the microphone -> the reply's last sample out of the loudspeaker.

Wire: the daemon's output looped straight into its input (a pure delay: any canceller removes it
whole) with speech mixed in 1.0-2.0 s into a reply: onset -> silence on the output port, the VAD's
decision on the published mic audio, the path from the decision to silence, the `done` report's
played_ms and the status cursor against the recording.
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

from common import ROOT, machine, start_jack, stop_jack

sys.path[:0] = [str(ROOT / "tests")]

RATE, PERIOD = 24000, 256
ROOM_SEEDS = {0.5: 1, 0.25: 2}
USERS = {"5dB-3s": (5, "3 s in"), "10dB-3s": (10, "3 s in"), "5dB-start": (5, "at the start")}
LOADS = {"idle": (0, 0), "one": (1, 0), "two": (2, 0), "two+memory": (2, 2), "heavy": (8, 2)}
"""--load: (spinning processes, memory-bound processes)."""
"""The user cases: dB below the echo, and when in the reply the user starts."""
VOICES = ["en-us", "en-gb", "en-us+f3", "de", "fr", "en-us+m3"]
PHRASES = ["Stop! Please stop talking now.", "Wait a moment.", "No, that is not what I asked.",
           "Hey, hold on.", "Excuse me, can you repeat that?", "Okay, thanks, that is enough."]
REPLY = "Hello there, this is a test of the speaker in a room, and it goes on for quite a while longer."


def summary(title: str, rows: list[dict[str, float]], keys: list[str]) -> None:
    print(f"\n{title}: {len(rows)} runs")
    for key in keys:
        values = [r[key] for r in rows if r[key] == r[key]]
        if values:
            print(f"  {key:30s} median {statistics.median(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f}"
                  f"{'' if len(values) == len(rows) else f'  ({len(rows) - len(values)} without)'}")


def percentiles(voice: str, ms: list[float]) -> None:
    """Onset -> silence over every user run of a voice (a run never interrupted counts as infinite)."""
    if not ms:
        return
    p50, p90, p95 = np.percentile(ms, [50, 90, 95])
    print(f"\n{voice}, every user run: {len(ms)} runs, onset -> silence p50 {p50:.0f} ms, p90 {p90:.0f} ms, "
          f"p95 {p95:.0f} ms, max {max(ms):.0f} ms; within 300 ms: {sum(m <= 300 for m in ms)}, "
          f"within 500 ms: {sum(m <= 500 for m in ms)}", flush=True)


def rooms(args, name: str, tmp: Path) -> None:
    from support.load import Load
    from support.patchbay import audio_rig, espeak, quiet, wait_recorded
    from support.room import FORECAST, Room, active_rms, at_voice_level
    from support.room_rig import RoomRig

    for voice in args.voices:
        pooled: list[float] = []
        path = None
        (tmp / voice).mkdir()
        if voice == "speech":
            path = tmp / "voice.npy"
            np.save(path, at_voice_level(espeak(FORECAST, tmp)))
        config = "lost_after_ms = 5000\n" + ("" if args.realtime else "realtime_priority = 0\n")
        with audio_rig(name, tmp / voice, config, voice=path) as (daemon, bay, sub, client, _), \
                Load(*LOADS[args.load]) as load:
            print(f"load: {load.describe()}; real time: {'jackd -R, audio threads SCHED_FIFO' if args.realtime else 'none'}"
                  f" ({client.status()['audio']['output']['scheduling']['feeder']})", flush=True)
            audio = client.status()["audio"]
            latency = round((audio["output"]["dac_latency_ms"] + audio["input"]["latency_ms"]) * RATE / 1000)
            rig = None
            rng = np.random.default_rng(0)
            for rt60 in args.rooms:
                seed = ROOM_SEEDS[rt60]
                if rig is None:
                    rig = RoomRig(name, Room(rt60, seed=seed), latency=latency)
                    bay.patch(record=True)
                    rig.connect(*bay.daemon_ports())
                else:
                    rig.enter(Room(rt60, seed=seed))
                alone: list[dict[str, float]] = []
                for run in range(args.alone_runs):
                    if run == 1:
                        rig.move()
                    quiet(client, rig)
                    sub.clear()
                    xruns, underruns = bay.xruns, client.status()["audio"]["output"]["underruns"]
                    done = client.speak(REPLY, max_audio_ms=10000).wait()
                    status = client.status()["audio"]
                    alone.append({"cut_itself": float(done.reason == "interrupted"),
                                  "false_vad_starts": float(len([e for e in sub.of("vad") if e["state"] == "start"])),
                                  "erle_db": status["input"]["echo_erle_db"], "xruns": float(bay.xruns - xruns),
                                  "underruns": float(status["output"]["underruns"] - underruns),
                                  "lag_max_ms": status["input"]["behind_max_ms"]})
                    label = "first in the room" if run == 0 else "first after a move" if run == 1 else "again"
                    print(f"{voice} rt60 {rt60} reply {run} ({label}): {done.reason}, {alone[-1]}", flush=True)
                summary(f"{voice}, rt60 {rt60}, replies alone (10 s)", alone,
                        ["cut_itself", "false_vad_starts", "erle_db", "xruns", "underruns", "lag_max_ms"])
                for below, when in (USERS[case] for case in args.users):
                    users: list[dict[str, float]] = []
                    for run in range(args.room_runs):
                        user = espeak(PHRASES[run % len(PHRASES)], tmp, VOICES[run % len(VOICES)])
                        quiet(client, rig)
                        mark, xruns = bay.mark(), bay.xruns
                        underruns = client.status()["audio"]["output"]["underruns"]
                        utt = client.speak(REPLY, max_audio_ms=8000)
                        into = rng.uniform(2.5, 3.5) if when == "3 s in" else rng.uniform(0.1, 0.3)
                        start = wait_recorded(bay, mark, int(into * RATE))
                        rig.voice_frame = -1
                        onset = rig.say(user, below, active_rms(bay.rec[start:bay.pos]))
                        done = utt.wait()
                        time.sleep(1.2)
                        end = start + int(np.flatnonzero(bay.rec[start:bay.pos])[-1]) + 1
                        silent = bay.frame_of(end - 1) + 1 + rig.latency
                        status = client.status()["audio"]
                        users.append({"interrupted": float(done.reason == "interrupted"),
                                      "onset_to_silence_ms": (silent - rig.voice_frame - onset) / RATE * 1000,
                                      "xruns": float(bay.xruns - xruns),
                                      "underruns": float(status["output"]["underruns"] - underruns),
                                      "lag_max_ms": status["input"]["behind_max_ms"]})
                        print(f"{voice} rt60 {rt60} user -{below} dB {when} run {run}: {users[-1]}", flush=True)
                        while rig.room.voice_pos < len(user):
                            time.sleep(0.05)
                    summary(f"{voice}, rt60 {rt60}, a user {below} dB below the echo, {when}", users,
                            ["interrupted", "onset_to_silence_ms", "xruns", "underruns", "lag_max_ms"])
                    pooled += [u["onset_to_silence_ms"] if u["interrupted"] else float("inf") for u in users]
            if rig is not None:
                rig.close()
        percentiles(voice, pooled)


def wire(args, name: str, tmp: Path) -> None:
    from support.daemon import Daemon
    from support.patchbay import (
        TEXT,
        Patchbay,
        Subscriber,
        espeak,
        heard,
        mic_after,
        onset_in_mic,
        quiet,
        reply_start,
        wait_recorded,
    )

    from edged.client import Client

    events = f"ipc://{tmp / 'events.sock'}"
    daemon = Daemon(tmp, config=f'[events]\nlisten = "{events}"\n[audio]\ndevice = "system"\ninput_device = "system"\n')
    bay, sub = Patchbay(name), Subscriber(events)
    rows: list[dict[str, float]] = []
    try:
        client = Client(daemon.endpoint)
        bay.patch(record=True, voice=True, loopback=True)
        rng = np.random.default_rng(0)
        glitched = 0
        for run in range(args.wire_runs):
            voice, phrase = VOICES[run % len(VOICES)], PHRASES[run % len(PHRASES)]
            speech = espeak(phrase, tmp, voice)
            quiet(client, bay)  # the last run's user has stopped (else the reply is cut as soon as it is heard)
            sub.clear()
            mark, xruns = bay.mark(), bay.xruns
            utt = client.speak(TEXT, stream=True, max_audio_ms=6000)
            wait_recorded(bay, mark, int(0.9 * RATE))
            before, status, after = bay.mark(), client.status(), bay.mark()
            wait_recorded(bay, mark, int(rng.uniform(1.0, 2.0) * RATE))
            said_at = sub.of("mic")[-1]["first_sample"]
            bay.say(speech)
            done = utt.wait()
            start = reply_start(bay.rec, mark)
            try:
                n = heard(bay, start, utt.pcm)
            except AssertionError:
                if bay.xruns == xruns:
                    raise
                print(f"run {run}: the recording glitched (audio-server xruns): not counted", flush=True)
                glitched += 1
                continue
            replies = status["audio"]["output"]["replies"]
            cursor = replies[0]["played_ms"] * RATE // 1000 if replies else float("nan")
            mid = (before + after) / 2 - start - 2 * PERIOD  # recording position moved to the DAC
            vad = [e for e in sub.of("vad") if e["state"] == "start"]
            mic = mic_after(sub, said_at, speech)
            first = sub.of("mic")[0]["first_sample"]
            onset16 = first + onset_in_mic(mic, said_at - first, speech)
            onset = bay.voice_start + int(np.flatnonzero(np.abs(speech) > 0.02)[0])
            row = {"reason_ok": float(done.reason == "interrupted"),
                   "onset_to_silence_ms": (start + n - onset) / RATE * 1000,
                   "decision_ms": (vad[0]["mic_sample"] - onset16) / 16 if vad else float("nan"),
                   "behind_ms": vad[0]["behind_ms"] if vad else float("nan"),
                   "played_ms_error_samples": done.report["played_ms"] * RATE / 1000 - n,
                   "cursor_error_samples": cursor - mid}
            barge = sub.of("barge_in")
            row["held_back_ms"] = (barge[0]["mic_sample"] - vad[0]["mic_sample"]) / 16 if barge and vad else float("nan")
            row["cut_ms"] = row["onset_to_silence_ms"] - row["decision_ms"] - row["held_back_ms"]
            row["refused_starts"] = float(sum(1 for e in vad if not e["near_end"] and e["while_playing"]))
            row["xruns"] = float(bay.xruns - xruns)
            rows.append(row)
            print(f"run {run} ({voice}, {phrase!r}): " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
        client.close()
    finally:
        sub.close()
        daemon.terminate()
        daemon.close()
        bay.close()
    summary(f"wire (the daemon's output looped into its input), period {PERIOD} frames, {glitched} runs"
            " not counted (audio-server xruns)", rows,
            ["onset_to_silence_ms", "decision_ms", "held_back_ms", "cut_ms", "refused_starts", "behind_ms",
             "played_ms_error_samples", "cursor_error_samples", "reason_ok", "xruns"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--room-runs", type=int, default=4, help="runs of each user case, per voice and room")
    p.add_argument("--alone-runs", type=int, default=6, help="replies alone per voice and room")
    p.add_argument("--voices", nargs="+", default=["speech", "babble"], choices=["speech", "babble"])
    p.add_argument("--rooms", nargs="+", type=float, default=list(ROOM_SEEDS), choices=list(ROOM_SEEDS),
                   help="RT60s, entered in this order")
    p.add_argument("--users", nargs="+", default=list(USERS), choices=list(USERS))
    p.add_argument("--wire-runs", type=int, default=8)
    p.add_argument("--only", nargs="+", default=["room", "wire"], choices=["room", "wire"])
    p.add_argument("--load", default="idle", choices=list(LOADS), help="processes kept busy beside the daemon (room)")
    p.add_argument("--no-realtime", dest="realtime", action="store_false",
                   help="jackd without -R and the daemon's audio threads at normal priority")
    args = p.parse_args()
    print("\n".join(machine()), flush=True)
    jackd = start_jack("edged-bench", realtime=args.realtime)
    name = os.environ["JACK_DEFAULT_SERVER"]
    try:
        for mode in args.only:
            tmp = Path(tempfile.mkdtemp(prefix=f"edged-bench-{mode}-"))
            (rooms if mode == "room" else wire)(args, name, tmp)
    finally:
        stop_jack(jackd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
