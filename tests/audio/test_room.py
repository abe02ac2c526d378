"""The real daemon in a room: its speaker output goes through a simulated room into its own
microphone (tests/support/room_rig.py: the microphone 6.7 cm from the loudspeaker, so the echo is
louder than any user; image-source reverberation; a mildly clipping loudspeaker; microphone noise;
the device's DAC and ADC latency as PortAudio reports them), on JACK's dummy backend.

The daemon's voice is espeak-ng speech standing in for the PCM at the speaker's input
(support/voiced.py): with speech as its voice, a daemon that hears itself cuts itself off (the
built-in model's babble never sounds like speech to the VAD, so it could not). Everything after the speaker's write is the
daemon's own. What is shown, each on the audio clock (JACK frame times):

1. replies of 10 s in rooms of 0.5 and 0.25 s reverberation end on their own, and no VAD start on
   them is taken for the user (`near_end`; a start the gate refuses is counted in `echo_refusals`):
   the first reply after boot, the first after someone moved, the first in a drier room, the first
   back in the first, more reverberant room;
2. a user 5 and 10 dB below the echo, speaking 3 s into a reply, silences it at the loudspeaker
   within SILENT_WITHIN_MS of the user's onset at the microphone (speech as the voice);
3. after a barge-in, the next reply ends on its own, and in its first 200 ms the microphone's
   residual is at least NEXT_REPLY_ERLE_DB below the echo;
4. with the echo LOUD_ECHO louder, the VAD starts on the residual of the first reply after boot,
   and the gate refuses it: the reply plays whole (the gate tested on every run, not by chance).

A measurement that failed after an audio-server xrun or a speaker underrun is taken again
(`support.takes.Takes`); a failure without one fails the test.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.barge import TEXT, barge_in, last_sound, speaking_room, starts, vad_line
from support.patchbay import need_jack_and_espeak, quiet, wait_recorded
from support.room import Room

need_jack_and_espeak()
pytest.importorskip("pyroomacoustics")

RATE = 24000
SILENT_WITHIN_MS = 500
"""The user's onset at the microphone -> the reply's last sample out of the loudspeaker (the README's bound)."""
NEXT_REPLY_ERLE_DB = 20.0
"""The echo of a reply after a barge-in, at its start, against the residual the VAD hears."""
USER = "Wait, stop, I have a question about Thursday."
LOUD_ECHO = 10.0
"""The echo's gain at the microphone in `loud_room`: 20 dB above `room`'s (the volume turned up, or
the microphone nearer the cone), more than the canceller's prior allows an unlearned room to give."""


@pytest.fixture(scope="module")
def room(jack_server, tmp_path_factory):
    with speaking_room(jack_server.name, tmp_path_factory.mktemp("room"), Room(0.5, seed=1), USER) as setup:
        yield setup


@pytest.fixture
def loud_room(jack_server, tmp_path_factory):
    """Its own daemon, gone before `room`'s boots (one PortAudio client on the server at a time)."""
    with speaking_room(jack_server.name, tmp_path_factory.mktemp("loud-room"), Room(0.5, seed=1), USER,
                       echo_gain=LOUD_ECHO) as setup:
        yield setup


def refusals_seen(client, sub, before: int) -> bool:
    """`status` counts, since `before`, one echo refusal per VAD start published while a reply played
    (the events come on another socket: waited for up to 2 s)."""
    deadline = time.monotonic() + 2
    while True:
        published = sum(e["while_playing"] for e in starts(sub))
        counted = client.status()["audio"]["input"]["echo_refusals"] - before
        if counted == published or time.monotonic() > deadline:
            return counted == published
        time.sleep(0.05)


def test_the_gate_refuses_the_echo_the_vad_starts_on_after_boot(loud_room):
    """The first reply after boot with the echo LOUD_ECHO louder: the filter has learned nothing and
    the echo exceeds what its prior expects until the delay search measures it, and the VAD starts on
    the residual 0.15-0.19 s in (offline, at every block phase: docs/dev/echo.md). The start is the
    echo's, so the gate refuses it, counts it, and the reply plays whole: with the verdict taken away
    (near-end always met) this reply is cut every run."""
    client, sub = loud_room.client, loud_room.sub
    sub.clear()
    done = client.speak(TEXT, max_audio_ms=4000).wait()
    playing = [e for e in starts(sub) if e["while_playing"]]
    assert playing, "the VAD never started on the echo's residual: the gate went untested"
    assert [e for e in playing if e["near_end"]] == [], playing
    assert refusals_seen(client, sub, 0), starts(sub)
    assert done.reason == "length", done.report
    assert done.report["played_ms"] == done.report["audio_ms"] >= 3900, done.report


def test_replies_are_never_cut_by_their_own_echo(room):
    """1. The first reply after boot: the canceller has heard nothing of this room. 2. The first
    after someone moved (a path change between replies). 3. The first in a drier room (every tap of
    the learned room is wrong at once). 4. The first back in the first room, more reverberant: its
    tail lies where the drier room's filter learned silence (docs/dev/echo.md, "Carried into another
    room"). The VAD may start on the residual of a filter still learning the room (about one run in
    five, the first reply in the drier room, about 2 s in: docs/dev/echo.md); the gate must refuse it."""
    client, sub = room.client, room.sub
    for step in ("boot", "moved", "a drier room", "back in the first room"):
        if step == "moved":
            room.rig.move()
        elif step == "a drier room":
            room.rig.enter(Room(0.25, seed=2))
        elif step == "back in the first room":
            room.rig.enter(Room(0.5, seed=1))
        for take in room.takes():
            with take:
                sub.clear()
                refusals = client.status()["audio"]["input"]["echo_refusals"]
                done = client.speak(TEXT, max_audio_ms=10000).wait()
                assert done.reason == "length", (step, done.report)
                assert done.report["played_ms"] == done.report["audio_ms"] >= 9900, (step, done.report)
                # the daemon's own voice never passes for the user, and a start the gate refused is counted
                assert [e for e in starts(sub) if e["near_end"]] == [], (step, starts(sub))
                assert refusals_seen(client, sub, refusals), (step, starts(sub))
    status = client.status()["audio"]["input"]  # (a take retaken after an xrun may have barged in)
    assert status["echo_erle_db"] > 30, status


@pytest.mark.parametrize("below_db", [5, 10])
def test_user_below_the_echo_silences_the_reply(room, below_db):
    bay, rig = room.bay, room.rig
    for take in room.takes():
        with take:
            done, start, onset, _ = barge_in(room, below_db, f"room-{below_db}-{take.attempt}")
            assert done.reason == "interrupted", done.report
            end = last_sound(bay, start)
            silent = bay.frame_of(end - 1) + 1 + rig.latency  # the loudspeaker's last sample: out of the DAC
            assert 0 < silent - onset <= SILENT_WITHIN_MS * RATE / 1000, ((silent - onset) / RATE * 1000, vad_line(room.sub))


def test_the_reply_after_a_barge_in_is_not_cut_by_its_echo(room):
    bay, sub, client, rig = room.bay, room.sub, room.client, room.rig
    for take in room.takes():
        with take:
            done, start, onset, said_at = barge_in(room, 5, f"room-next-{take.attempt}")
            assert done.reason == "interrupted", done.report
            # the user's onset in the published mic audio (16 kHz), against its JACK frame
            mic = sub.mic_audio()
            first = sub.of("mic")[0]["first_sample"]
            after = said_at["first_sample"] - first
            onset16 = after + int(np.flatnonzero(np.abs(mic[after:]) > 0.02)[0])
            quiet(client, rig)  # the user has finished speaking, on the audio clock
            mark = bay.mark()
            nxt = client.speak(TEXT, max_audio_ms=3000).wait()
            assert nxt.reason == "length", nxt.report
            begin = bay.frame_of(wait_recorded(bay, mark, 1)) + rig.latency  # its first sample out of the DAC
            at = rig.index_of(begin)
            window = slice(at, at + RATE // 5)
            at16 = onset16 + (begin - onset) * 16000 // RATE
            mic = sub.mic_audio()
            residual = mic[at16:at16 + 3200].astype(np.float64)
            echo = rig.rec[window].astype(np.float64)
            assert len(residual) == 3200
            erle = 10 * np.log10(np.mean(echo ** 2) / max(np.mean(residual ** 2), 1e-20))
            assert erle >= NEXT_REPLY_ERLE_DB, erle

