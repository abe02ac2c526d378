"""The room rig's daemon and its barge-in measurements, shared by tests/audio/test_room.py and
tests/audio/test_two_clocks.py: a reply with a user speaking over it, on the audio clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from support.patchbay import audio_rig, espeak, quiet, wait_recorded
from support.room import FORECAST, Room, active_rms, at_voice_level
from support.room_rig import RoomRig
from support.takes import Takes, settle

RATE = 24000
TEXT = "Hello there, this is a test of the speaker in a room, and it goes on for quite a while longer."
"""What the daemon is asked to say (the built-in model's babble; a speech stand-in replaces it)."""


class Setup:
    def __init__(self, daemon, bay, sub, client, rig: RoomRig, user: np.ndarray) -> None:
        self.daemon, self.bay, self.sub, self.client, self.rig = daemon, bay, sub, client, rig
        self.user = user

    def takes(self) -> Takes:
        """Taken again after an audio-server xrun; the speaker must not underrun without one."""
        return Takes(lambda: self.bay.xruns, lambda: self.client.status()["audio"]["output"]["underruns"])


@contextmanager
def speaking_room(server: str, tmp: Path, room: Room, user: str, *, seconds: float | None = None, audio: str = "",
                  **rig: float) -> Iterator[Setup]:
    """A daemon booted with espeak-ng speech of FORECAST as its voice (looped to `seconds` of it when
    given: the stand-in plays its recording once from each reply's start), in `room` on JACK server
    `server`, through a RoomRig told the latency the daemon reports (`rig`: its other arguments), and
    `user` (espeak-ng en-us+f2) ready to speak over it. `audio`: more config lines, under [audio] (a
    section header of their own starts another section)."""
    speech = at_voice_level(espeak(FORECAST, tmp))
    voice = tmp / "voice.npy"
    np.save(voice, speech if seconds is None else np.resize(speech, int(seconds * RATE)))
    with audio_rig(server, tmp, "lost_after_ms = 5000\n" + audio, voice=voice) as (daemon, bay, sub, client, _):
        audio = client.status()["audio"]
        latency = round((audio["output"]["dac_latency_ms"] + audio["input"]["latency_ms"]) * RATE / 1000)
        if "echo_late" in rig:  # the echo this many samples later than the latency reported
            rig["echo_latency"] = latency + int(rig.pop("echo_late"))
        room_rig = RoomRig(server, room, latency=latency, **rig)  # type: ignore[arg-type]
        bay.patch(record=True)
        room_rig.connect(*bay.daemon_ports())
        setup = Setup(daemon, bay, sub, client, room_rig, espeak(user, tmp, "en-us+f2"))
        settle(lambda: bay.xruns)
        try:
            yield setup
        finally:
            room_rig.close()


def starts(sub) -> list[dict]:
    return [e for e in sub.of("vad") if e["state"] == "start"]


def vad_line(sub) -> list[tuple]:
    """The VAD's decisions, short: (state, mic_sample, near_end, behind_ms)."""
    return [(e["state"], e["mic_sample"], e["near_end"], e["behind_ms"]) for e in sub.of("vad")]


def barge_in(room: Setup, below_db: float, session: str):
    """A reply, and the user speaking `below_db` under its echo once 3 s of it have played; returns
    (the reply's done, its start in the recording, the user's onset at the microphone as a JACK frame,
    the last mic event published before the user spoke)."""
    bay, client, rig = room.bay, room.client, room.rig
    quiet(client, rig)
    room.sub.clear()
    mark = bay.mark()
    utt = client.speak(TEXT, max_audio_ms=8000, session=session)
    start = wait_recorded(bay, mark, 3 * RATE)
    echo_rms = active_rms(bay.rec[start:start + 3 * RATE])  # the daemon's output: the echo path has unit energy
    said_at = room.sub.of("mic")[-1]
    onset = rig.say(room.user, below_db, echo_rms)
    done = utt.wait()
    while rig.voice_frame < 0:
        time.sleep(0.01)
    return done, start, rig.voice_frame + onset, said_at


def last_sound(bay, start: int) -> int:
    """The recording index after the reply's last sample, once a second of silence follows it."""
    deadline = time.monotonic() + 10
    while True:
        pos = bay.pos
        sound = np.flatnonzero(bay.rec[start:pos])
        end = start + int(sound[-1]) + 1
        if pos - end >= RATE:
            return end
        assert time.monotonic() < deadline, "the reply's output never went silent"
        time.sleep(0.02)
