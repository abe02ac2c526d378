"""The echo canceller and the taps it reads, on synthetic rooms: an echo path with a direct sound and
a reverberant tail (RT60 0.4 s), a mildly clipping loudspeaker and microphone noise. The rooms of
pyroomacoustics are in test_room.py (the daemon) and scripts/bench/echo.py (the comparison)."""

from __future__ import annotations

import numpy as np
from support.room import loudspeaker

from edged.audio.echo import LEAD_BLOCKS, EchoCanceller
from edged.audio.listener import near_blocks
from edged.audio.tap import Tap
from edged.config import VadConfig

RATE, BLOCK = 24000, 256
LISTENERS_BAR = 0.5
"""The share of near-end blocks the listener asks of speech before it may barge in, pinned as a number
(test_gate.py pins the rule itself: 3 of 6 blocks), not read from the code under test."""


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Noise with a syllable-rate envelope and pauses: broadband like a voice, never periodic."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    envelope = (0.5 + 0.5 * np.sin(2 * np.pi * 3.3 * t)) ** 2 * (np.sin(2 * np.pi * 0.4 * t) > -0.6)
    return (0.08 * rng.standard_normal(n) * envelope).astype(np.float32)


def room_path(seed: int, rt60: float = 0.4, direct: int = 40) -> np.ndarray:
    """An echo path of unit energy: the direct sound `direct` samples in, then early reflections
    and an exponentially decaying diffuse tail."""
    rng = np.random.default_rng(seed)
    n = int(rt60 * RATE)
    h = np.zeros(direct + n, np.float64)
    h[direct] = 1.0
    t = np.arange(n) / RATE
    h[direct:] += 0.15 * rng.standard_normal(n) * 10 ** (-3 * t / rt60) * (t > 0.002)
    return (h / np.sqrt(np.sum(h ** 2))).astype(np.float32)


def echo_of(ref: np.ndarray, delay: int, path: np.ndarray, seed: int = 0) -> np.ndarray:
    """What the microphone hears of `ref`: `delay` samples of latency, the loudspeaker, the path, noise."""
    from scipy.signal import fftconvolve

    delayed = np.concatenate([np.zeros(delay, np.float32), loudspeaker(ref)])[:len(ref)]
    noise = np.random.default_rng(seed + 99).standard_normal(len(ref)) * 10 ** (-62 / 20)
    return (fftconvolve(delayed, path)[:len(ref)] + noise).astype(np.float32)


def run(mic: np.ndarray, ref: np.ndarray, ec: EchoCanceller) -> tuple[np.ndarray, np.ndarray]:
    """Block by block: the output (aligned with the input) and each block's near-end verdict."""
    out = np.zeros(len(mic) + BLOCK, dtype=np.float32)
    near = np.zeros(len(mic) // BLOCK, dtype=bool)
    for j, i in enumerate(range(0, len(mic) - BLOCK + 1, BLOCK)):
        ec.process(mic[i:i + BLOCK], ref[i:i + BLOCK], out[i:i + BLOCK])
        near[j] = ec.near_end()
    return out[ec.delay:ec.delay + len(mic)], near


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-20))


def sounding(ref: np.ndarray, delay: int) -> np.ndarray:
    """Per block: whether the echo (the reference `delay` samples later) carries sound."""
    late = np.concatenate([np.zeros(delay, np.float32), ref])[:len(ref)]
    blocks = late[:len(late) // BLOCK * BLOCK].reshape(-1, BLOCK)
    return (blocks ** 2).mean(axis=1) > 1e-5


def test_spans_the_room_and_finds_its_delay():
    """The filter spans the reverberant tail, not one STFT hop: > 35 dB once learned, where one
    complex tap per bin stops near the tail's energy (-18..-24 dB in such rooms)."""
    ref = speechlike(5.0, 0)
    path = room_path(0)
    mic = echo_of(ref, 700, path)
    ec = EchoCanceller(RATE, BLOCK, latency=700)
    out, _ = run(mic, ref, ec)
    late = slice(3 * RATE, 5 * RATE)
    assert db(mic[late]) - db(out[late]) > 35
    assert ec.echo_delay() == 700 + 40  # the latency and the room's direct sound, to the sample
    tail = np.sum(path[40 + BLOCK // 2:] ** 2)  # what one 10.7 ms hop leaves out
    assert 10 * np.log10(tail) > -20


def test_starts_from_the_known_latency_and_searches_when_it_is_wrong():
    """Told the latency, the canceller suppresses the echo from its first second of sound. Told a
    wrong one (the echo 2500 samples later, past the lead partitions), the delay search moves the
    filter there within a second of sound, and it learns the echo again."""
    ref = speechlike(4.0, 1)
    mic = echo_of(ref, 2500, room_path(1))  # the direct sound 2540 samples after the reference
    first = slice(2500, 2500 + RATE)
    told = EchoCanceller(RATE, BLOCK, latency=2500)
    out, _ = run(mic, ref, told)
    assert db(mic[first]) - db(out[first]) > 25
    assert told.lag == 2500 - LEAD_BLOCKS * BLOCK and told.lags_found > 0  # the search agreed: nothing moved

    wrong = EchoCanceller(RATE, BLOCK, latency=0)
    out, _ = run(mic, ref, wrong)
    assert wrong.lag == 2540 - LEAD_BLOCKS * BLOCK  # moved to the echo's peak
    late = slice(3 * RATE, 4 * RATE)
    assert db(mic[late]) - db(out[late]) > 30


def test_an_echo_not_yet_learned_is_never_the_user():
    """From its first block, a canceller that has heard nothing expects the whole echo its prior
    allows (up to 10 dB above the reference): no echo block stands above that, so the gate never
    takes the first echo of a room for a user, whatever the room does while the filter learns."""
    for seed in range(3):
        ref = speechlike(2.0, 10 + seed)
        mic = echo_of(ref, 600, room_path(10 + seed)) * 3.0  # the echo 9.5 dB above the reference
        _, near = run(mic, ref, EchoCanceller(RATE, BLOCK, latency=600))
        assert not near[sounding(ref, 600)].any(), seed


def test_the_user_passes_double_talk_and_the_filter_keeps_its_depth():
    """A user 5 dB below the echo, after the filter has learned it: the voice comes out nearly whole,
    its blocks stand above the echo, and the echo after it is cancelled as deeply as before. No
    detector holds the filter: the error it cannot explain slows its step."""
    ref = speechlike(7.0, 3)
    echo = echo_of(ref, 600, room_path(3))
    t = np.arange(RATE) / RATE
    voice = np.zeros_like(ref)
    voice[4 * RATE:5 * RATE] = np.sin(2 * np.pi * 190 * t) * (np.sin(2 * np.pi * 3 * t) ** 2)
    voice *= 10 ** ((db(echo[2 * RATE:]) - 5 - db(voice[4 * RATE:5 * RATE])) / 20)
    quiet, _ = run(echo, ref, EchoCanceller(RATE, BLOCK, latency=600))
    out, near = run(echo + voice, ref, EchoCanceller(RATE, BLOCK, latency=600))
    during = slice(4 * RATE, 5 * RATE)
    through = out[during] - quiet[during]
    assert np.corrcoef(through, voice[during])[0, 1] > 0.9
    assert db(voice[during]) - db(through) < 3  # the voice loses less than 3 dB
    assert near[4 * RATE // BLOCK + 8:5 * RATE // BLOCK - 8].mean() > 0.6
    after = slice(5 * RATE + RATE // 10, 7 * RATE)
    assert db(out[after]) - db(quiet[after]) < 3  # no deeper residual than without the user


def test_a_user_far_below_the_echo_is_still_near_end():
    """A broadband user 10 dB below a learned echo, sounding in the same bins as it: the share of the
    user's blocks the gate calls near-end reaches the listener's bar (LISTENERS_BAR) only when the
    gate's coherence does not count the user's own voice as echo (the bias of a short average
    between unrelated signals is a quarter of their power, as much as the 6 dB verdict allows:
    counted, the share falls to 0.44)."""
    ref = speechlike(7.0, 6)
    echo = echo_of(ref, 600, room_path(6))
    user = np.zeros_like(ref)
    user[4 * RATE:6 * RATE] = speechlike(2.0, 7)
    user *= 10 ** ((db(echo[2 * RATE:]) - 10 - db(user[4 * RATE:6 * RATE])) / 20)
    _, near = run(echo + user, ref, EchoCanceller(RATE, BLOCK, latency=600))
    talking = sounding(user, 0)[4 * RATE // BLOCK + 2:6 * RATE // BLOCK - 2]
    assert near[4 * RATE // BLOCK + 2:6 * RATE // BLOCK - 2][talking].mean() >= LISTENERS_BAR


def test_a_pause_in_the_reply_is_no_user_but_a_user_in_it_is():
    """In a pause of the reply the echo the filter expects dies away while the microphone's
    background stays: the background is expected too (the least residual over the last 1.5 s of
    blocks with no reference in the filter's span, here the second before the reply), so the
    pause's blocks are not the user's, never as many as the listener's share asks. Else a VAD start
    on a loud syllable's residual that ran into a pause was taken for the user there, and the reply
    cut itself off (scripts/bench/echo_timings.py). A user 10 dB below the echo, speaking in the
    pause, still is."""
    quiet = np.zeros(RATE, np.float32)
    ref = np.concatenate([quiet, speechlike(3.0, 8), quiet, quiet])
    echo = echo_of(ref, 600, room_path(8))
    _, near = run(echo, ref, EchoCanceller(RATE, BLOCK, latency=600))
    pause = near[4 * RATE // BLOCK:6 * RATE // BLOCK]
    window = near_blocks(VadConfig().min_speech_ms, RATE, BLOCK)
    shares = np.convolve(pause, np.ones(window) / window, mode="valid")
    assert shares.max() < LISTENERS_BAR and pause.mean() < 0.05  # the listener's bar is never met
    said = slice(4 * RATE + RATE // 2, 5 * RATE + RATE // 2)
    user = np.zeros_like(ref)
    user[said] = speechlike(1.0, 9)
    user *= 10 ** ((db(echo[2 * RATE:4 * RATE]) - 10 - db(user[said])) / 20)
    _, near = run(echo + user, ref, EchoCanceller(RATE, BLOCK, latency=600))
    blocks = slice(said.start // BLOCK + 2, said.stop // BLOCK - 2)
    assert near[blocks][sounding(user, 0)[blocks]].mean() >= 0.9


def test_a_path_change_is_tracked_and_never_taken_for_the_user():
    """The echo path changes mid-reply (someone moved): the residual coherent with the echo estimate
    reopens the filter's uncertainty, the suppressor takes that residual for echo (no echo block is
    the user's), and within a second the echo is cancelled deeply again."""
    ref = speechlike(6.0, 4)
    change = 3 * RATE
    mic = np.concatenate([echo_of(ref, 600, room_path(4))[:change], echo_of(ref, 600, room_path(5, direct=70))[change:]])
    ec = EchoCanceller(RATE, BLOCK, latency=600)
    out, near = run(mic, ref, ec)
    assert ec.path_changes >= 1
    echo = sounding(ref, 600)
    assert not near[change // BLOCK:][echo[change // BLOCK:]].any()
    later = slice(change + RATE, change + 2 * RATE)
    assert db(mic[later]) - db(out[later]) > 30


def test_a_more_reverberant_room_is_expected_and_relearned():
    """Carried from a room of 0.25 s into one of 0.5 s between replies (pyroomacoustics rooms: the same
    direct sound, another tail): the drier room's filter learned its late taps silent, and the new
    tail lands there. It is expected by the suppressor (no echo block is the user's, bar a stray one:
    the listener wants half of six) and cancelled from the first second (1 block, 52 dB). Without the
    floor on each tap's uncertainty (UNCERTAINTY_FLOOR): 48 blocks, 31 dB."""
    from support.room import Room, unit

    ref = np.concatenate([speechlike(6.0, 10), np.zeros(RATE, np.float32), speechlike(6.0, 11)])
    change = 13 * RATE // 2  # in the pause between the replies
    dry, wet = (unit(Room(rt60, seed=seed).responses().speaker) for rt60, seed in ((0.25, 2), (0.5, 1)))
    mic = np.concatenate([echo_of(ref, 600, dry)[:change], echo_of(ref, 600, wet)[change:]])
    out, near = run(mic, ref, EchoCanceller(RATE, BLOCK, latency=600))
    reply = 7 * RATE
    blocks = slice(reply // BLOCK, (reply + 2 * RATE) // BLOCK)
    assert int((near[blocks] & sounding(ref, 600)[blocks]).sum()) <= 2
    first = slice(reply, reply + RATE)
    assert db(mic[first]) - db(out[first]) > 35


def test_shift_keeps_the_filter_when_the_reference_moves():
    ref = speechlike(4.0, 5)
    mic = echo_of(ref, 900, room_path(5))
    ec = EchoCanceller(RATE, BLOCK, latency=900)
    run(mic[:3 * RATE], ref[:3 * RATE], ec)
    lag, learned = ec.lag, ec.w.copy()
    ec.shift(-200)  # the listener realigned: the reference now arrives 200 samples earlier
    assert ec.lag == lag - 200 and np.array_equal(ec.w, learned)
    ec.shift(10 * RATE)  # out of range: start over
    assert ec.lag == ec.max_lag and not np.any(ec.w)


def test_tap_reads_by_index_with_zeros_for_what_it_lacks():
    tap = Tap(1000, 1.0)
    for k in range(30):  # 30 blocks of 100 samples, more than the tap holds
        tap.record(np.full(100, k, np.float32))
    assert tap.written == 3000
    out = np.empty(300, np.float32)
    tap.read(1900, out)  # 1900..2000 were overwritten (capacity 1000): zeros, then blocks 20 and 21
    assert not out[:100].any() and (out[100:200] == 20).all() and (out[200:] == 21).all()
    tap.read(2950, out)  # past the newest sample: zeros
    assert (out[:50] == 29).all() and not out[50:].any()


def test_an_echo_that_appears_where_there_was_none_is_learned():
    """Replies played while the microphone heard none of them (a disconnected microphone): the
    filter holds no echo, and the residual has nothing to be coherent with. When the echo appears,
    the delay search finds it within half a second of sound, the filter becomes as uncertain as its
    prior again, and it learns the echo as it would a new room."""
    ref = speechlike(6.0, 6)
    appears = 3 * RATE
    mic = echo_of(ref, 600, room_path(6))
    mic[:appears] = 0.0  # a disconnected microphone
    ec = EchoCanceller(RATE, BLOCK, latency=600)
    out, _ = run(mic, ref, ec)
    assert ec.path_changes >= 1
    later = slice(appears + RATE + RATE // 2, 6 * RATE)
    assert db(mic[later]) - db(out[later]) > 30


def test_an_echo_before_the_reported_latency_is_learned_at_full_step():
    """An audio server's loopback skips the DAC whose latency the speaker reports: the echo starts
    two blocks before where the listener says, and the lag cannot go below zero. The delay search
    moves the prior to the partition the echo starts in; left where the latency put it, that
    partition learns at a hundredth of the step (38 dB in the same window, against 61)."""
    wire = np.ones(1, np.float32)
    for seed in range(2):
        ref = speechlike(8.0, 30 + seed)
        mic = echo_of(ref, 0, wire, seed)
        mic[:6 * RATE] = echo_of(np.zeros(6 * RATE, np.float32), 0, wire, seed)  # heard none of it
        ec = EchoCanceller(RATE, BLOCK, latency=LEAD_BLOCKS * BLOCK)
        out, _ = run(mic, ref, ec)
        soon = slice(6 * RATE + RATE // 4, 6 * RATE + RATE // 2)
        assert ec.lag == 0 and db(mic[soon]) - db(out[soon]) > 45, seed



def test_the_users_voice_between_replies_is_no_echo_appearing():
    """A user speaks between two replies (the microphone sounds, the reference is silent), and the
    next reply starts while that voice is still in the delay search's second of history. The search
    weighs the microphone against the reference only where the reference sounds: counted whole, the
    user's voice made the learned echo look unlearned (an echo appearing where there was none), the
    filter's uncertainty went back to the prior at the user's level, and the suppressor took the
    next user, 10 dB below the echo, for echo for a second (a barge-in decided a second late). The
    echo is an audio server's loopback, which the search finds from a block of reference; the
    reply's start moves through the search's half-second cadence."""
    wire = np.ones(1, np.float32)
    for shift in range(0, RATE // 2, RATE // 20):
        ref = np.concatenate([speechlike(3.0, 8), np.zeros(RATE + shift, np.float32), speechlike(2.5, 9)])
        second = 4 * RATE + shift
        user = np.zeros_like(ref)
        user[3 * RATE:second - RATE // 5] = speechlike(2.0, 10)[:second - RATE // 5 - 3 * RATE]
        user[second + RATE:second + 2 * RATE] = speechlike(1.0, 11) * 10 ** (-10 / 20)
        ec = EchoCanceller(RATE, BLOCK, latency=LEAD_BLOCKS * BLOCK)
        _, near = run(echo_of(ref, 0, wire) + user, ref, ec)
        assert ec.path_changes == 0, shift
        speaking = slice((second + RATE) // BLOCK + 2, (second + RATE + RATE // 4) // BLOCK)
        assert near[speaking][sounding(user, 0)[speaking]].mean() >= LISTENERS_BAR, shift


def test_a_peak_at_another_delay_moves_the_filter_only_when_the_echo_left():
    """The delay search moves a learned filter only when the echo left the delays it covers. A
    louder copy of the reply at another delay, over the echo for a second and a half (as a user's
    voice over a reply made GCC-PHAT peak elsewhere in a room, at about twice the echo's
    correlation), once moved the filter there and back, starting over twice: 6-11 dB of
    cancellation in the second after it instead of 39-40. When the echo itself moves there, the
    filter follows and learns it."""
    for seed in range(2):
        ref = speechlike(7.0, 60 + seed)
        mic = echo_of(ref, 600, room_path(60 + seed))
        elsewhere = echo_of(ref, 3000, room_path(70 + seed))
        voice = slice(3 * RATE, 4 * RATE + RATE // 2)
        mic[voice] += 2.0 * elsewhere[voice]
        ec = EchoCanceller(RATE, BLOCK, latency=600)
        out, _ = run(mic, ref, ec)
        after = slice(voice.stop, voice.stop + RATE)
        assert ec.lag == 600 - LEAD_BLOCKS * BLOCK, seed  # moved there and back, it ends 40 samples off
        assert db(mic[after]) - db(out[after]) > 30, seed

        moved = np.concatenate([mic[:3 * RATE], elsewhere[3 * RATE:]])
        ec = EchoCanceller(RATE, BLOCK, latency=600)
        out, _ = run(moved, ref, ec)
        assert ec.lag == 3000 + 40 - LEAD_BLOCKS * BLOCK, seed
        late = slice(5 * RATE, 7 * RATE)
        assert db(moved[late]) - db(out[late]) > 40, seed
