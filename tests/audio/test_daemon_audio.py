"""The real daemon on a real audio server: JACK's dummy backend (24 kHz, 256-frame periods).

A JACK client (`Patchbay`) records the daemon's output port and plays speech (espeak-ng) into the
daemon's input port; the daemon is a subprocess talking PortAudio to the same server. Bounds, in
JACK frames (PERIOD = 256 = 10.7 ms):
- the recording equals the reply's PCM bit-exactly (no resampling at 24 kHz); the `done` report's
  `played_ms` equals what was recorded, to the millisecond;
- the cursor in `status` agrees with the recording within one period, once the recording position
  is moved to the DAC (the playback latency L: two periods on the dummy backend);
- a cancel while it plays cuts the reply between what was recorded at the call and at `done` (plus
  the period in flight), and `played_ms` equals the recorded prefix;
- user speech during a reply cuts it: `interrupted`, `played_ms` = the recorded prefix; the output is
  silent within the barge-in decision's latency (measured on the `mic` events: the VAD's start, or
  later when the echo canceller held it back) plus the listener's lag
  behind the microphone at the decision (its `behind_ms`: the load on the machine) plus the path to
  the speaker (bounded by CUT_FRAMES);
- the daemon's own voice looped into its microphone is cancelled (ERLE > 30 dB) and never barges in.

A measurement that failed after an audio-server xrun or a speaker underrun (a period of the
recording dropped or shifted, or a gap the daemon counted) is taken again, up to three takes
(`support.takes.Takes`); a failure without one fails the test. The rig plays one reply before the
first test and waits for the audio to stay free of glitches (the load of the daemon's boot is over).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.patchbay import (
    TEXT,
    audio_rig,
    heard,
    mic_after,
    need_jack_and_espeak,
    onset_in_mic,
    quiet,
    reply_start,
    wait_pos,
    wait_recorded,
)
from support.takes import Takes, settle

from edged.history.text import units

need_jack_and_espeak()

RATE = 24000
PERIOD = 256
L = 2 * PERIOD
"""JACK's playback latency on the dummy backend: the DAC time is two periods after the cycle."""
CUT_FRAMES = 6 * PERIOD
"""Speech onset -> silence, beyond the VAD's decision:
- input latency: 1 period;
- the listener's block: 1 period (the echo canceller works on the same block);
- its polling: < 1 period;
- the 24 -> 16 kHz resampler's delay: < 1 period (soxr LQ holds back 100 samples at 16 kHz,
  150 frames; `edged.audio.listener.RESAMPLE_QUALITY`);
- the speaker's next block: 1 period;
- the loop through the audio server: 1 period. The daemon's output feeds its own input and the
  patchbay, and in a cycle of connections one of them carries the previous cycle's buffer."""
VAD_DECISION_MS = 250
"""Onset -> the barge-in decision on the published mic audio: the VAD's start (min_speech_ms 64 +
silero's own), held back while the echo canceller does not put the speech above the echo
(`scripts/bench/bargein.py --only wire` measures both)."""
LAG_MS = 3 * PERIOD * 1000 / RATE
"""The listener's lag behind the microphone when it decides (`behind_ms`): its block, its poll and
one period of slack. More means it fell behind: a regression, unless the audio server had an xrun."""


@pytest.fixture(scope="module")
def rig(jack_server, tmp_path_factory):
    """One daemon on the module's JACK server, its event socket, and the patchbay. A reply may run
    only ring_ms + ahead_ms = 940 ms ahead of the speaker, so every test here also exercises
    generation paused on a full buffer and resumed as the speaker drains it."""
    with audio_rig(jack_server.name, tmp_path_factory.mktemp("audio-daemon"),
                   'lost_after_ms = 5000\nring_ms = 300\nahead_ms = 640\n[history]\ndefault_ms_per_unit = 250.0\n') as rig:
        _, bay, _, client, _ = rig
        bay.patch(record=False)
        assert client.speak(TEXT, max_audio_ms=1000, session="warm-up").wait().reason == "length"
        settle(lambda: bay.xruns)
        yield rig


def takes(rig) -> Takes:
    """Takes of a measurement on the rig: taken again when it failed after an audio-server xrun;
    the daemon's speaker must not underrun without one."""
    _, bay, _, client, _ = rig
    return Takes(lambda: bay.xruns, lambda: client.status()["audio"]["output"]["underruns"])


def test_reply_plays_bit_exact_and_cursor_follows_the_dac(rig):
    daemon, bay, sub, client, _ = rig
    for take in takes(rig):
        with take:
            bay.patch(record=True)
            sub.clear()
            mark = bay.mark()
            utt = client.speak(TEXT, stream=True, max_audio_ms=3000)
            wait_recorded(bay, mark, RATE)  # a second into the reply
            before = bay.mark()
            status = client.status()
            after = bay.mark()
            done = utt.wait()
            pcm = utt.pcm
            assert done.reason == "length" and len(pcm) == 3000 * RATE // 1000 - 3000 * RATE // 1000 % 1920

            start = reply_start(bay.rec, mark)
            assert heard(bay, start, pcm) == len(pcm)  # bit-exact, all of it
            assert done.report["played_ms"] == len(pcm) * 1000 // RATE

            (playing,) = status["audio"]["output"]["replies"]
            cursor = playing["played_ms"] * RATE // 1000
            lo, hi = before - start - L - PERIOD - RATE // 1000, after - start - L + PERIOD
            assert lo <= cursor <= hi, (cursor, lo, hi)

            ticks = [e for e in sub.of("playback") if e["id"] == utt.id]
            assert ticks[-1] == {**ticks[-1], "final": True, "played_ms": done.report["played_ms"]}
            assert [t["played_ms"] for t in ticks] == sorted(t["played_ms"] for t in ticks) and len(ticks) >= 10


def test_replies_play_in_admission_order_back_to_back(rig):
    daemon, bay, sub, client, _ = rig
    for take in takes(rig):
        with take:
            bay.patch(record=True)
            mark = bay.mark()
            first = client.speak(TEXT, stream=True, max_audio_ms=1500)
            second = client.speak("A second reply that was generated ahead.", stream=True, max_audio_ms=1000)
            for utt in (first, second):
                utt.wait()
            a, b = first.pcm, second.pcm
            start = reply_start(bay.rec, mark)
            both = np.concatenate([a, b])
            wait_pos(bay, start + len(both))
            assert np.array_equal(bay.rec[start:start + len(both)], both)  # in admission order, gapless: b was generated ahead
            assert first.done.report["played_ms"] == len(a) * 1000 // RATE
            assert second.done.report["played_ms"] == len(b) * 1000 // RATE


def test_generation_paced_by_the_speaker_makes_the_same_frames(rig):
    """A reply held back by its full buffer (and stepped without the paused member in between)
    produces exactly the frames of one that never waits. At the default repetition penalty: the
    paused reply holds the lower slot, so the batched decode runs over its row while it waits."""
    daemon, bay, sub, client, _ = rig
    bay.patch(record=True)
    penalty = {"repetition_penalty": 1.05}
    paced = client.speak(TEXT, max_audio_ms=3000, report_codes=True, sampling=penalty)
    free = client.speak(TEXT, max_audio_ms=3000, report_codes=True, play=False, sampling=penalty)
    a, b = paced.wait(), free.wait()
    assert a.reason == b.reason == "length"
    assert a.report["rvq_codes"] == b.report["rvq_codes"] and len(a.report["rvq_codes"]) == 37
    assert a.report["played_ms"] == a.report["audio_ms"]
    assert a.report["rtf"] > 0.5 > b.report["rtf"]  # paced by the speaker (3 s, 0.7 s ahead) vs free-running


def test_cancel_while_playing_reports_what_was_heard(rig):
    daemon, bay, sub, client, _ = rig
    for take in takes(rig):
        with take:
            bay.patch(record=True)
            mark = bay.mark()
            utt = client.speak(TEXT, stream=True, max_audio_ms=4000)
            # Cancel once a second of the reply is on the recording (the audio clock, not a sleep):
            # generation runs at most 700 ms ahead of the speaker, so the reply is still playing.
            start = wait_recorded(bay, mark, RATE)
            called = bay.pos - start
            utt.cancel()
            done = utt.wait()
            answered = bay.pos - start
            assert done.reason == "cancelled"
            n = heard(bay, start, utt.pcm)
            # Cut after what was recorded before the call, and before `done` (stop_now precedes it).
            assert called <= n <= answered + PERIOD, (called, n, answered)
            assert abs(done.report["played_ms"] * RATE // 1000 - n) <= RATE // 1000


def test_user_speech_barges_in(rig):
    """The speech goes into the microphone together with the daemon's own voice (a loopback), as a
    room would mix them: the echo canceller removes the voice, the VAD hears the user. Each take
    speaks in its own session."""
    daemon, bay, sub, client, speech = rig
    # Not measured here: the first reply whose echo the canceller hears is its cold case (docs/dev/echo.md,
    # "The first barge-in on the wire": a short first word is suppressed with the echo it is still
    # learning). One unmeasured barge-in first.
    quiet(client, bay)
    bay.patch(record=True, voice=True, loopback=True)
    first = client.speak(TEXT, max_audio_ms=5000, session="barge-first")
    wait_recorded(bay, bay.mark(), RATE)
    bay.say(speech)
    first.wait()
    for take in takes(rig):
        with take:
            quiet(client, bay)
            bay.patch(record=True, voice=True, loopback=True)
            sub.clear()
            mark = bay.mark()
            utt = client.speak(TEXT, stream=True, max_audio_ms=5000, session=f"barge-{take.attempt}")
            wait_recorded(bay, mark, RATE * 3 // 2)  # 1.5 s into the reply, on the audio clock
            said_at = sub.of("mic")[-1]["first_sample"]  # published before the user starts: the search starts here
            bay.say(speech)
            done = utt.wait()
            assert done.reason == "interrupted", done.report
            start = reply_start(bay.rec, mark)
            n = heard(bay, start, utt.pcm)
            assert abs(done.report["played_ms"] * RATE // 1000 - n) <= RATE // 1000
            (barge,) = sub.of("barge_in")
            assert barge["id"] == utt.id and barge["played_ms"] == done.report["played_ms"]

            # decision latency, on the microphone audio the daemon published (16 kHz): the VAD's start,
            # and the cut's (the same sample, or later while the echo canceller held the start back)
            starts = [e for e in sub.of("vad") if e["state"] == "start" and e["while_playing"]]
            assert starts, sub.of("vad")
            vad_start = starts[0]  # a start the canceller held back may be followed by the one that cut
            mic = mic_after(sub, said_at, speech)
            first_mic = sub.of("mic")[0]["first_sample"]
            after = said_at - first_mic
            onset16 = first_mic + onset_in_mic(mic, after, speech)
            decision_ms = (vad_start["mic_sample"] - onset16) / 16
            cut_ms = (barge["mic_sample"] - onset16) / 16
            assert 0 < decision_ms <= cut_ms <= VAD_DECISION_MS, (decision_ms, cut_ms)
            # speech onset (JACK frames) -> the last sample of the reply on the output port
            onset = bay.voice_start + int(np.flatnonzero(np.abs(speech) > 0.02)[0])
            silent_after = start + n - onset
            late = vad_start["behind_ms"]  # the listener's lag behind the microphone when it decided (load)
            assert late <= LAG_MS, late  # beyond it, only an audio-server xrun excuses the take
            assert silent_after <= (cut_ms + late) * RATE / 1000 + CUT_FRAMES, (silent_after, cut_ms, late)

            # the history holds what was heard: whole words, as many as the recording's length says
            (turn,) = client.history(f"barge-{take.attempt}", wait=True)
            assert turn["interrupted"] and turn["response_id"] == utt.id and TEXT.startswith(turn["content"])
            words = units(TEXT)
            assert turn["content"] == "" or any(turn["content"] == TEXT[:w.end] for w in words)  # ends on a word
            rates = client.status()["history"]["voice_ms_per_unit"]
            ms_per_unit = rates.get("(default)", 250.0)
            heard_ms = n * 1000 / RATE  # the recording's length of the reply
            count = int(max(0.0, heard_ms - 160) // ms_per_unit)
            assert len(units(turn["content"])) in {max(0, count - 1), max(0, count - 2)}  # one withheld; ms rounding


def test_own_voice_in_the_microphone_does_not_barge_in(rig):
    daemon, bay, sub, client, _ = rig
    bay.patch(record=True, loopback=True)
    quiet(client, bay)
    before = client.status()["audio"]["input"]["barge_ins"]
    utt = client.speak(TEXT, max_audio_ms=4000)
    done = utt.wait()
    status = client.status()["audio"]["input"]
    assert done.reason == "length" and done.report["played_ms"] == done.report["audio_ms"]
    assert status["barge_ins"] == before
    assert status["echo_cancel"] and status["echo_erle_db"] > 30, status

