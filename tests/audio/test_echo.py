"""The echo canceller and the taps it reads, on synthetic signals with a known echo path."""

from __future__ import annotations

import numpy as np
import pytest

from edged.audio.echo import EchoCanceller
from edged.audio.tap import Tap

RATE, BLOCK = 24000, 256


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Noise with a syllable-rate envelope: broadband like a voice, never periodic."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    envelope = (0.5 + 0.5 * np.sin(np.arange(n) / RATE * 2 * np.pi * 3.3)) ** 2
    return (0.1 * rng.standard_normal(n) * envelope).astype(np.float32)


def run(mic: np.ndarray, ref: np.ndarray, ec: EchoCanceller, hold: slice | None = None) -> np.ndarray:
    """Block by block; the filter is held (adapt=False) for blocks starting inside `hold`."""
    out = np.zeros(len(mic), dtype=np.float32)
    block = np.zeros(BLOCK, dtype=np.float32)
    for i in range(0, len(mic) - BLOCK + 1, BLOCK):
        adapt = hold is None or not hold.start <= i < hold.stop
        ec.process(mic[i:i + BLOCK], ref[i:i + BLOCK], block, adapt=adapt)
        out[i:i + BLOCK] = block
    return out


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-20))


def echo_of(ref: np.ndarray, delay: int, path: np.ndarray) -> np.ndarray:
    delayed = np.concatenate([np.zeros(delay, np.float32), ref])[:len(ref)]
    return np.convolve(delayed, path)[:len(ref)].astype(np.float32)


def test_finds_the_delay_and_removes_the_echo():
    ref = speechlike(4.0, 0)
    mic = echo_of(ref, 1700, np.array([0.7, 0.25, -0.1, 0.05], np.float32))
    ec = EchoCanceller(RATE, BLOCK)
    out = run(mic, ref, ec)
    assert ec.lag == 1700 and ec.lags_found >= 3
    late = slice(2 * RATE, 4 * RATE)
    assert db(mic[late]) - db(out[late]) > 40  # ERLE once converged
    assert ec.erle_db > 40


@pytest.mark.parametrize("held", [False, True])
def test_user_speech_passes_through_during_double_talk(held):
    """The user's voice comes out unchanged. Adapting through the double talk costs ERLE for about
    the averages' memory afterwards; holding the filter (the listener does, while the VAD hears
    speech) keeps it."""
    ref = speechlike(6.0, 1)
    voice = np.zeros_like(ref)
    t = np.arange(RATE) / RATE
    voice[4 * RATE:5 * RATE] = (0.1 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) ** 2).astype(np.float32)
    mic = echo_of(ref, 600, np.array([0.5, 0.2], np.float32)) + voice
    out = run(mic, ref, EchoCanceller(RATE, BLOCK), hold=slice(4 * RATE, 5 * RATE) if held else None)
    heard = out[4 * RATE + BLOCK:5 * RATE]  # the output lags by one block
    assert np.corrcoef(heard, voice[4 * RATE:5 * RATE - BLOCK])[0, 1] > 0.99
    after = slice(5 * RATE + BLOCK, 6 * RATE)
    assert db(mic[after]) - db(out[after]) > (40 if held else 15)  # the filter never diverges


@pytest.mark.parametrize("rolled_back", [False, True])
def test_rollback_undoes_the_double_talk_before_the_vad_decided(rolled_back):
    """The VAD hears the user only some time after the speech begins (here 19 blocks, 203 ms), and
    until then the filter adapts through the double talk. When the VAD decides, the listener rolls
    the filter back (rollback_s = 0.5 s) and then holds it. That leaves the filter as good as one
    held from the onset. Without the rollback, the echo in the 200 ms after the speech (where a
    reply that follows a barge-in starts) meets a noisy filter."""
    ref = speechlike(6.0, 1)
    voice = np.zeros_like(ref)
    t = np.arange(RATE) / RATE
    voice[4 * RATE:5 * RATE] = (0.1 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) ** 2).astype(np.float32)
    mic = echo_of(ref, 600, np.array([0.5, 0.2], np.float32)) + voice
    decided = 4 * RATE + 19 * BLOCK
    ec = EchoCanceller(RATE, BLOCK)
    run(mic[:decided], ref[:decided], ec)
    if rolled_back:
        ec.rollback()
        assert ec.lag == 600
    out = run(mic[decided:], ref[decided:], ec, hold=slice(0, 5 * RATE - decided))
    after = slice(5 * RATE + BLOCK - decided, 5 * RATE + BLOCK + RATE // 5 - decided)  # the next 200 ms
    erle = db(mic[decided:][after]) - db(out[after])
    assert erle > 60 if rolled_back else erle < 40, erle  # measured: 72 dB rolled back, 27 dB not


def test_no_rollback_past_the_start_of_the_echo():
    """In the first rollback_s of sound after a pause, what the filter learned is this echo: a
    rollback keeps it. Otherwise a filter still converging would be thrown back each time its own
    echo's residual sounded like speech to the VAD."""
    ref = np.concatenate([np.zeros(RATE, np.float32), speechlike(1.0, 3)])
    mic = echo_of(ref, 300, np.array([0.6], np.float32))
    ec = EchoCanceller(RATE, BLOCK)
    early = RATE + 20 * BLOCK  # 213 ms into the sound
    run(mic[:early], ref[:early], ec)
    learned = ec.s_mx.copy()
    ec.rollback()
    assert np.array_equal(ec.s_mx, learned) and np.any(learned)


def test_shift_keeps_the_filter_when_the_reference_moves():
    ref = speechlike(5.0, 2)
    mic = echo_of(ref, 900, np.array([0.6], np.float32))
    ec = EchoCanceller(RATE, BLOCK)
    run(mic[:3 * RATE], ref[:3 * RATE], ec)
    assert ec.lag == 900
    ec.shift(-200)  # the listener realigned: the reference now arrives 200 samples earlier
    assert ec.lag == 700
    ec.shift(10 * RATE)  # out of range: start over
    assert ec.lag == ec.max_lag and not np.any(ec.s_mx)


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
