"""Playback on a real audio server (JACK dummy, 24 kHz, 256-frame periods), recorded by a JACK client.

Bounds, in JACK frames (PERIOD = 256 = 10.7 ms):
- output equals the PCM bit-exactly (JACK runs at the artifact's rate: no resampling);
- the cursor `played()` agrees with the recording within one period, once the recording position is
  moved to the DAC (by JACK's playback latency L: two periods on the dummy backend); against the raw
  recording position (what the graph has taken so far, a period at a time) it trails by L - P .. L + 2P;
- after `stop_now` returns the output port is silent within one period (on the audio clock, read
  around the call);
- back-to-back replies leave no gap; a slow producer's gaps are exactly the underruns reported;
- the callback never waits on the producer: every audio cycle while the producer holds its lock runs
  the callback (counted on the audio clock), and 99 % of callbacks run within their period (the
  slowest one on a loaded machine is a descheduled thread, not the callback's own work).

Readings of two clocks are bracketed (read before and after), so a descheduled test thread widens a
bracket but never fails a bound. A take during which the audio server reports an xrun (a cycle that
missed its deadline: the rig's own recording loses or shifts a period) is taken again, up to TAKES.
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
from support.takes import Takes

if shutil.which("jackd") is None:
    pytest.skip("jackd is not installed (scripts/install-system-deps.sh installs jackd2)", allow_module_level=True)

RATE = 24000
"""The rate conftest runs jackd at: the artifact's, so nothing is resampled."""
PERIOD = 256
"""conftest's JACK period (10.7 ms): the audio period the bounds are stated in."""

TAKES = 3
"""Attempts per test when the audio server reports xruns (see `take`)."""
CALLBACK_MAX_S = PERIOD / RATE
"""The callback's 99th-percentile run: within its period (10.7 ms), the audio server's deadline. It
takes 0.2-0.3 ms (copy + bookkeeping in Python); more is a thread descheduled on a loaded machine."""


def chirp(seconds: float, f0: float = 200.0, f1: float = 4000.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds))
    return (0.5 * np.sin(phase + np.pi / 4)).astype(np.float32)  # starts non-zero: alignment is exact


def tone(seconds: float, level: float = 0.3) -> np.ndarray:
    """Never zero, so silence in the recording means the reply stopped."""
    t = np.arange(int(seconds * RATE)) / RATE
    return (level + 0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def first_nonzero(x: np.ndarray, start: int = 0) -> int:
    idx = np.flatnonzero(x[start:])
    assert len(idx), "nothing was recorded"
    return start + int(idx[0])


def write_all(pb, reply_id, pcm: np.ndarray, chunk: int = 1920) -> None:
    """Produce a reply at generation speed (faster than real time), retrying while the ring is full."""
    i = 0
    while i < len(pcm):
        n = pb.write(reply_id, pcm[i:i + chunk])
        i += n
        if n == 0:
            time.sleep(0.005)
    pb.end(reply_id)


@pytest.fixture
def take(jack_server, sd, jack_device, recorder):
    """`take(body)` runs `body(playback)` on a fresh Playback whose output the recorder hears, again
    (up to TAKES times) when an attempt failed while the audio server reported an xrun: a cycle that
    missed its deadline loses or shifts the rig's own recording, so that attempt measured nothing.
    A failure in a take without an xrun fails the test."""
    from edged.audio.playback import Playback

    assert (jack_server.rate, jack_server.period) == (RATE, PERIOD)

    def run(body):
        for take in Takes(lambda: recorder.xruns, limit=TAKES):
            pb = Playback(device=jack_device, sample_rate=RATE, blocksize=0, latency="low", ring_seconds=5.0)
            try:
                assert pb.device_rate == RATE
                recorder.connect_from(recorder.portaudio_output())
                time.sleep(0.05)
                with take:
                    return body(pb)
            finally:
                assert pb.close(timeout=2.0)

    return run


def graph_delay(pb, recorder, reply_id, i0: int) -> int:
    """Frames between the cycle in which the playback's callback produced the reply's first sample
    and the cycle in which the recorder saw it: 0, or one period when JACK ran the recorder before
    the playback in a cycle (then it reads the previous cycle's buffer). A property of the test rig,
    not of the cursor, so it is removed from the comparison, in whole periods only."""
    offset = clock_offset(pb, recorder)
    start = pb.ring_start(reply_id)
    # The cycle's own time (its DAC time less the latency), not the callback's wall time: a callback
    # that a loaded machine runs late in its cycle still belongs to that cycle.
    dac = next(dac + (start - ring) / RATE for ring, n, dac, _ in pb.timeline() if ring <= start < ring + n)
    delay = recorder.frame_of(i0) - (dac * RATE + offset - latency_frames(pb))
    whole = PERIOD * round(delay / PERIOD)
    assert whole in (0, PERIOD) and abs(delay - whole) < PERIOD / 2, delay
    return whole


def clock_offset(pb, recorder, tries: int = 50) -> float:
    """JACK frames minus stream seconds * RATE, read between two JACK clock readings at most 32
    frames apart (a thread descheduled between the readings would skew the offset: read again)."""
    for _ in range(tries):
        before = recorder.client.frame_time
        stream_now = pb.stream_time()
        after = recorder.client.frame_time
        if after - before <= 32:
            return (before + after) / 2 - stream_now * RATE
    pytest.fail(f"no two JACK clock readings within 32 frames in {tries} tries")


def latency_frames(pb) -> int:
    """JACK's playback latency as PortAudio adds it to outputBufferDacTime (two periods on the dummy backend)."""
    return round(pb.dac_latency_s * RATE)


def test_output_is_bit_exact_and_cursor_tracks_recording(take, recorder):
    def body(playback):
        pcm = chirp(2.0)
        recorder.start()
        playback.begin("a")
        producer = threading.Thread(target=write_all, args=(playback, "a", pcm))
        producer.start()

        # Sample the cursor while it plays: (played, JACK frame time and recording position before, after).
        readings = []
        while len(readings) < 400:
            before, pos_before = recorder.client.frame_time, recorder.pos
            played = playback.played("a")
            after, pos_after = recorder.client.frame_time, recorder.pos
            readings.append((played, before, after, pos_before, pos_after))
            if played >= len(pcm):
                break
            time.sleep(0.007)
        producer.join()
        time.sleep(0.1)
        rec = recorder.stop()

        i0 = first_nonzero(rec)
        assert np.array_equal(rec[i0:i0 + len(pcm)], pcm), "recorded output differs from the PCM"
        assert not rec[i0 + len(pcm):].any()
        assert playback.played("a") == len(pcm)
        assert playback.underruns == 0

        delay = graph_delay(playback, recorder, "a", i0)
        start_frame = recorder.frame_of(i0) - delay  # JACK frame of the cycle that produced sample 0
        lat = latency_frames(playback)
        errors, lags = [], []
        for played, before, after, pos_before, pos_after in readings:
            if played == 0 or played >= len(pcm):
                continue  # outside the reply: nothing to compare
            # Sample k reaches the DAC at start_frame + k + lat; at JACK time t, those with k <= t - start_frame - lat.
            lo = before - start_frame - lat + 1
            hi = after - start_frame - lat + 1
            errors.append(0 if lo <= played <= hi else min(abs(played - lo), abs(played - hi)))
            # raw: produced so far minus heard, bracketed like the clock (the position moves while we read)
            lags.append((max(0, pos_before - i0) + delay - played, max(0, pos_after - i0) + delay - played))
        assert len(errors) > 50
        low, high = max(lo for lo, _ in lags), min(hi for _, hi in lags)
        print(f"\ncursor vs recording at the DAC: {min(errors)}..{max(errors)} frames, mean {np.mean(errors):.1f};"
              f" raw recorded-minus-played: {min(lo for lo, _ in lags)}..{max(hi for _, hi in lags)} frames"
              f" (L={lat}, period={PERIOD}, rig delay {delay})")
        assert max(abs(e) for e in errors) <= PERIOD
        # Each reading brackets the true lag, and every bracket must reach into [L - P, L + 2P]: the
        # graph takes a whole period at once (0..P ahead of any moment), and the cursor is within P.
        assert all(hi >= lat - PERIOD and lo <= lat + 2 * PERIOD for lo, hi in lags), (low, high, lat)

    take(body)


def test_stop_now_silences_within_one_period(take, recorder):
    def body(playback):
        pcm = tone(3.0)
        recorder.start()
        playback.begin("s")
        write_all(playback, "s", pcm)  # all of it is in the ring (5 s): only stop_now can cut it
        time.sleep(0.8)
        called = recorder.client.frame_time  # the audio clock around the call: a loaded machine may
        playback.stop_now("s")               # deschedule this thread anywhere in between, never the cut
        returned = recorder.client.frame_time
        time.sleep(0.3)
        rec = recorder.stop()

        i0 = first_nonzero(rec)
        cut = i0 + int(np.flatnonzero(rec[i0:] == 0.0)[0])
        assert not rec[cut:].any(), "output resumed after stop_now"
        assert np.array_equal(rec[i0:cut], pcm[:cut - i0])
        silent_at = recorder.frame_of(cut) - graph_delay(playback, recorder, "s", i0)
        print(f"\nstop_now -> silence on the output port: {silent_at - called} frames after the call "
              f"({(returned - called)} frames in it)")
        assert called - PERIOD <= silent_at <= returned + PERIOD
        # The cursor settles on exactly what was output.
        assert playback.played("s") == cut - i0
        assert playback.write("s", pcm[:100]) == 100  # dropped, not an error

    take(body)


def test_two_replies_back_to_back_in_admission_order(take, recorder):
    def body(playback):
        a, b = chirp(0.6), tone(0.6, level=-0.2)
        recorder.start()
        playback.begin("a")
        playback.begin("b")
        assert playback.write("b", b[:100]) == 0  # not b's turn while a is being written
        writer = threading.Thread(target=lambda: (write_all(playback, "a", a), write_all(playback, "b", b)))
        writer.start()
        writer.join()
        while playback.played("b") < len(b):
            time.sleep(0.02)
        rec = recorder.stop()

        i0 = first_nonzero(rec)
        both = np.concatenate([a, b])
        assert playback.underruns == 0
        assert np.array_equal(rec[i0:i0 + len(both)], both), "gap or reorder between the replies"
        assert playback.played("a") == len(a) and playback.played("b") == len(b)

    take(body)


def test_a_cut_reply_that_never_played_is_final_without_a_later_reply(take, recorder):
    """A barge-in while `a` plays and `b` waits in the ring behind it (written, not begun at the DAC):
    both are stopped; each is final (a: what was heard, b: nothing) once the cut has passed the DAC,
    though no reply plays after them (the dropped samples count as passed)."""
    def body(playback):
        a, b = tone(2.0), chirp(1.0)
        recorder.start()
        playback.begin("a")
        playback.begin("b")
        write_all(playback, "a", a)
        write_all(playback, "b", b)  # all of both in the ring (5 s)
        time.sleep(0.5)
        playback.stop_now("a")
        playback.stop_now("b")
        deadline = time.monotonic() + 1.0  # the cut passes the DAC within a few periods
        while playback.final("a") is None or playback.final("b") is None:
            assert time.monotonic() < deadline, (playback.final("a"), playback.final("b"))
            time.sleep(0.01)
        rec = recorder.stop()
        i0 = first_nonzero(rec)
        heard = int(np.flatnonzero(rec[i0:] == 0.0)[0])
        assert playback.final("b") == 0 and playback.final("a") == heard > 0
        assert not rec[i0 + heard:].any()

    take(body)


def test_slow_producer_underruns_are_counted_and_callback_never_blocks(take, recorder):
    def body(playback):
        pcm = tone(1.5, level=0.25)
        recorder.start()
        playback.begin("slow")

        def produce():
            chunk = 480  # 20 ms
            for k, i in enumerate(range(0, len(pcm), chunk)):
                assert playback.write("slow", pcm[i:i + chunk]) == len(pcm[i:i + chunk])
                if i + chunk < len(pcm):
                    time.sleep(0.02 if k % 10 else 0.12)  # every tenth chunk arrives 100 ms late
            playback.end("slow")

        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(0.5)
        with playback._lock:  # the producer side is stuck: the callback must not care
            callbacks, cycles = playback.callbacks, recorder.cycles
            time.sleep(0.2)
            held = (playback.callbacks - callbacks, recorder.cycles - cycles)
        producer.join()
        while playback.played("slow") < len(pcm):
            time.sleep(0.02)
        rec = recorder.stop()

        i0 = first_nonzero(rec)
        heard = rec[i0:]
        last = int(np.flatnonzero(heard)[-1]) + 1
        gaps = int(np.count_nonzero(heard[:last] == 0.0))
        assert np.array_equal(heard[:last][heard[:last] != 0.0], pcm), "samples lost or reordered"
        status = playback.status()
        print(f"\nunderruns {status['underruns']} ({status['underrun_samples']} samples), gaps in the recording {gaps};"
              f" callback max {status['callback_max_ms']} ms over {status['callbacks']} callbacks")
        assert playback.underruns >= 5
        # Every gap is a counted underrun. The converse allows one period: a callback between the last
        # write and end() rightly counts silence that follows the last sample.
        assert gaps <= playback.underrun_samples <= gaps + PERIOD
        assert playback.played("slow") == len(pcm)
        # Every audio cycle while the producer held its lock ran the callback (each count read once
        # at each end: 2 apart at most), and 99 % of callbacks ran within their period.
        assert held[1] >= 10 and abs(held[0] - held[1]) <= 2, held
        durations = playback.callback_seconds()
        assert len(durations) > 100 and np.percentile(durations, 99) < CALLBACK_MAX_S

    take(body)
