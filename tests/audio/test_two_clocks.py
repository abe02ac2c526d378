"""The real daemon in a room whose microphone runs on its own clock and whose echo comes later than
the daemon is told: a USB microphone beside an I2S or HDMI loudspeaker.

The room rig of tests/audio/test_room.py (JACK's dummy backend, the room of Room(0.5, seed=1),
espeak-ng speech as the daemon's voice), with its microphone sampling 100 ppm faster, then 100 ppm
slower, than the speaker plays (tests/support/drift.py: a streaming resampler between the loudspeaker
and the room) and the echo arriving tens of ms after the output and input latency PortAudio reports
(CLOCKS). On one JACK clock the daemon's two taps advance together, so it is the canceller that must
follow an echo whose delay grows (or shrinks) 2.4 samples a second (the listener's realignment, which two taps at different rates
need, is tests/audio/test_reference_clocks.py's). What is shown, on the audio clock:

1. 60 s of replies of speech (two of 30 s, queued back to back) end on their own, played whole, and
   no VAD start on them is taken for the user; the canceller's ERLE, sampled every 2 s, stays above
   ERLE_DB from SETTLE_S in (a sample whose span saw the audio server miss a cycle left out: the
   glitch shifts the microphone against the reference, which is the rig's, not the canceller's); the
   delay search found the echo where it is (`echo_alignments`, `echo_delay_ms` within
   DELAY_WITHIN_MS of the rig's delay, the room's and JACK's loop cycle), and the canceller measured
   the drift (`echo_drift_ppm` within DRIFT_WITHIN_PPM);
2. then a user 5 dB below the echo, speaking 3 s into a reply, silences it within SILENT_WITHIN_MS
   of the user's onset at the microphone. The canceller measures the slide and takes it out of the
   reference (edged/audio/slide.py); before, it took the slide for a path change every 2 s or so and
   a user whose onset fell while it relearned was heard 1.3-1.8 s late (two runs of three).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.barge import TEXT, barge_in, last_sound, speaking_room, starts, vad_line
from support.patchbay import need_jack_and_espeak, wait_recorded
from support.room import Room

need_jack_and_espeak()
pytest.importorskip("pyroomacoustics")

RATE = 24000
CLOCKS = ((100.0, 30), (-100.0, 60))
"""(ppm, ms): the microphone's clock against the speaker's, faster then slower, and how much later than
the reported latency puts it the echo comes. A slower microphone's echo comes earlier and earlier, 2.4
samples a second: the rig's FIFO starts with 300 s of that on top of its own (support/room_rig.py),
more than 30 ms on top of the latency the daemon reports."""
REPLY_S = 60
REPLIES = 2
"""The 60 s are two replies of 30 s, queued: the built-in model's KV cache (max_seq 512) holds at most
about 36 s of one reply. The speaker plays them back to back, so the echo is speech throughout."""
ERLE_DB = 25.0
"""The least 2 s sample from SETTLE_S in: measured 39.2 dB at +100 ppm (most 40-58), 30.1 at -100 with the
echo 60 ms late (30.1-51.4). Before the canceller took the slide out of the reference, it followed an
echo that slides 2.4 samples a second only in part and took the slide for a path change every 2 s or
so: 13.7 and 15.2 dB the least, in two takes."""
HELD = REPLY_S // 4
"""2 s samples from SETTLE_S in, at least, whose span had no audio-server xrun (a take with fewer measured
the server's glitches, and is taken again)."""
SETTLE_S = 4.0
"""The canceller's time to converge on the slowed clock's echo: the sample 2 s in was 26.2 dB in one run
and 21.9 in two others (on a 2-core Intel Xeon VM), 37.5 and more from 4 s."""
DELAY_WITHIN_MS = 3.0
DRIFT_WITHIN_PPM = 5.0
"""The slide the canceller measures (status `echo_drift_ppm`) against the rig's drift."""
SILENT_WITHIN_MS = 500
"""The user's onset at the microphone -> the reply's last sample out of the loudspeaker (the README's bound)."""
USER = "Wait, stop, I have a question about Thursday."


@pytest.fixture(scope="module", params=CLOCKS, ids=lambda clocks: f"{clocks[0]:+.0f}ppm-{clocks[1]}ms")
def room(jack_server, tmp_path_factory, request):
    ppm, late_ms = request.param
    with speaking_room(jack_server.name, tmp_path_factory.mktemp("two-clocks"), Room(0.5, seed=1), USER,
                       seconds=REPLY_S // REPLIES + 2, echo_late=late_ms * RATE // 1000, drift_ppm=ppm) as setup:
        yield setup


def test_a_long_reply_keeps_its_echo_cancelled(room):
    bay, sub, client, rig = room.bay, room.sub, room.client, room.rig
    direct = int(np.argmax(np.abs(rig.room.paths.speaker)))  # the room's own delay to the direct path
    for take in room.takes():
        with take:
            sub.clear()
            mark = bay.mark()
            utts = [client.speak(TEXT, max_audio_ms=REPLY_S * 1000 // REPLIES, session=f"long-{take.attempt}-{i}")
                    for i in range(REPLIES)]
            utt = utts[-1]
            start = wait_recorded(bay, mark, 1, timeout=30)
            erle: list[tuple[float, float]] = []
            xruns = [bay.xruns]  # the audio server's xruns when each sample was taken, and before the first
            while True:
                client.poll()
                if utt.over:
                    break
                erle.append(((bay.pos - start) / RATE, client.status()["audio"]["input"]["echo_erle_db"]))
                xruns.append(bay.xruns)
                time.sleep(2)
            dones = [u.wait() for u in utts]
            audio = client.status()["audio"]["input"]
            # the graph's loop (daemon -> room -> daemon) is closed by JACK a cycle late
            truth_ms = (rig.echo_delay() + direct + rig.period) * 1000 / RATE
            print(f"\nERLE (s, dB): {erle}\necho_delay_ms {audio['echo_delay_ms']} (the echo at {truth_ms:.2f}), "
                  f"alignments {audio['echo_alignments']}, path changes {audio['echo_path_changes']}")
            for done in dones:
                assert done.reason == "length", done.report
                assert done.report["played_ms"] == done.report["audio_ms"] >= REPLY_S * 1000 // REPLIES - 100, done.report
            sound = np.flatnonzero(np.abs(bay.rec[start:bay.pos]) > 1e-3)
            gaps = np.diff(sound).max() / RATE  # the longest pause of the voice: no gap between the replies
            assert sound[-1] / RATE >= REPLY_S - 1 and gaps < 1, (sound[-1] / RATE, gaps)
            assert [e for e in starts(sub) if e["near_end"]] == [], starts(sub)
            # a sample whose 2 s saw the audio server miss a cycle measured the glitch, not the canceller
            held = [db for (t, db), before, now in zip(erle, xruns, xruns[1:]) if t >= SETTLE_S and now == before]
            assert len(held) >= HELD and min(held) > ERLE_DB, (erle, xruns)
            assert audio["echo_alignments"] > 0, audio
            assert abs(audio["echo_drift_ppm"] - rig.drift.ppm) <= DRIFT_WITHIN_PPM, audio
            assert abs(audio["echo_delay_ms"] - truth_ms) <= DELAY_WITHIN_MS, (audio["echo_delay_ms"], truth_ms)


def test_user_below_the_echo_silences_the_reply(room):
    bay, rig = room.bay, room.rig
    for take in room.takes():
        with take:
            done, start, onset, _ = barge_in(room, 5, f"clocks-{take.attempt}")
            assert done.reason == "interrupted", done.report
            end = last_sound(bay, start)
            silent = bay.frame_of(end - 1) + 1 + round(rig.echo_delay())  # the loudspeaker's last sample, in the room
            print(f"\nonset -> silence: {(silent - onset) / RATE * 1000:.0f} ms")
            assert 0 < silent - onset <= SILENT_WITHIN_MS * RATE / 1000, ((silent - onset) / RATE * 1000, vad_line(room.sub))
