"""Test signals for the VAD benchmark: speech-free sounds a microphone hears (noise, tones, beeps,
music, clicks, knocks), each a float32 array at 16 kHz."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edged.audio.vad import SAMPLE_RATE

NONSPEECH_S = 40.0
"""Seconds of each non-speech signal."""


def dbfs(level: float) -> float:
    return float(10 ** (level / 20))


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def white(n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(n)
    return x / rms(x)


def shaped(n: int, rng: np.random.Generator, gain: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """White noise shaped in frequency by gain(f) (f in Hz), unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum *= gain(np.fft.rfftfreq(n, 1 / SAMPLE_RATE))
    x = np.fft.irfft(spectrum, n)
    return x / rms(x)


def pink(n: int, rng: np.random.Generator) -> np.ndarray:
    return shaped(n, rng, lambda f: 1 / np.sqrt(np.maximum(f, 20.0)))


def band(n: int, rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    return shaped(n, rng, lambda f: ((f >= lo) & (f <= hi)).astype(np.float64))


def gated(x: np.ndarray, on_s: float, period_s: float, ramp_s: float = 0.005) -> np.ndarray:
    """x switched on for on_s of every period_s, with raised-cosine ramps (bursts, beeps)."""
    t = np.arange(len(x)) / SAMPLE_RATE % period_s
    env = np.clip(np.minimum(t, on_s - t) / ramp_s, 0.0, 1.0) * (t < on_s)
    return x * (0.5 - 0.5 * np.cos(np.pi * env))


def tones(n: int, freqs: list[float], harmonics: int = 1) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE
    x = sum(np.sin(2 * np.pi * f * k * t) / k for f in freqs for k in range(1, harmonics + 1) if f * k < 7900)
    return np.asarray(x) / rms(np.asarray(x))


def chord_progression(n: int, step_s: float = 0.5) -> np.ndarray:
    chords = [[261.6, 329.6, 392.0], [349.2, 440.0, 523.3], [392.0, 493.9, 587.3], [220.0, 261.6, 329.6]]
    step = int(step_s * SAMPLE_RATE)
    x = np.concatenate([tones(step, chords[i % 4], harmonics=6) for i in range(-(-n // step))])[:n]
    return gated(x, step_s - 0.02, step_s, ramp_s=0.01)


def melody(n: int, step_s: float = 0.25) -> np.ndarray:
    """A harmonic instrument with 5.5 Hz vibrato, a new note every step_s (singing-like, no words)."""
    notes = 220.0 * 2 ** (np.array([0, 2, 4, 5, 7, 9, 7, 4]) / 12)
    t = np.arange(n) / SAMPLE_RATE
    f0 = notes[(t // step_s).astype(int) % len(notes)] * (1 + 0.01 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 9))
    return gated(np.asarray(x) / rms(np.asarray(x)), step_s - 0.03, step_s, ramp_s=0.01)


def syllabic(n: int, rng: np.random.Generator) -> np.ndarray:
    """Speech-shaped noise (100-4000 Hz, -6 dB/octave above 500 Hz) modulated at a 4 Hz syllable rate."""
    x = shaped(n, rng, lambda f: ((f >= 100) & (f <= 4000)) / np.maximum(f / 500, 1.0))
    t = np.arange(n) / SAMPLE_RATE
    return x * np.sin(np.pi * 4 * t) ** 2 * np.sqrt(2)


def impacts(n: int, rng: np.random.Generator, per_s: float, decay_s: float, freqs: list[float] | None) -> np.ndarray:
    """Decaying impacts at random times: noise (clicks, typing) or damped resonances (knocks)."""
    x = np.zeros(n)
    length = int(6 * decay_s * SAMPLE_RATE)
    t = np.arange(length) / SAMPLE_RATE
    body = rng.standard_normal(length) if freqs is None else sum(np.sin(2 * np.pi * f * t) for f in freqs)
    hit = np.asarray(body) * np.exp(-t / decay_s)
    for start in rng.integers(0, n - length, int(per_s * n / SAMPLE_RATE)):
        x[start:start + length] += hit * rng.uniform(0.3, 1.0)
    return x / np.abs(x).max()


def siren(n: int, lo: float = 600.0, hi: float = 1200.0, period_s: float = 2.0) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE
    f = lo + (hi - lo) * 0.5 * (1 - np.cos(2 * np.pi * t / period_s))
    x = np.sin(2 * np.pi * np.cumsum(f) / SAMPLE_RATE)
    return x / rms(x)


def steps(n: int, rng: np.random.Generator, period_s: float = 1.0) -> np.ndarray:
    """Noise that jumps between -60 and -20 dBFS every period_s, alternating white and pink (a fan, a door)."""
    step = int(period_s * SAMPLE_RATE)
    parts = [(white if i % 4 < 2 else pink)(step, rng) * dbfs(-20 if i % 2 else -60) for i in range(-(-n // step))]
    return np.concatenate(parts)[:n]


def nonspeech(rng: np.random.Generator) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (kind, signal), NONSPEECH_S each."""
    n = int(NONSPEECH_S * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    out: dict[str, tuple[str, np.ndarray]] = {}
    for level in (-60, -40, -26, -15):
        out[f"white {level} dBFS"] = ("noise", white(n, rng) * dbfs(level))
        out[f"pink {level} dBFS"] = ("noise", pink(n, rng) * dbfs(level))
    out["brown noise -20 dBFS"] = ("noise", shaped(n, rng, lambda f: 1 / np.maximum(f, 20.0)) * dbfs(-20))
    out["noise steps -60/-20 dBFS, 1 s"] = ("noise", steps(n, rng))
    out["tone 440 Hz"] = ("tones", tones(n, [440.0]) * dbfs(-20))
    out["tone 3 kHz"] = ("tones", tones(n, [3000.0]) * dbfs(-20))
    out["beeps 1 kHz 200/500 ms"] = ("tones", gated(tones(n, [1000.0]), 0.2, 0.5) * dbfs(-20))
    out["tremolo 600 Hz, 6 Hz AM"] = ("tones", tones(n, [600.0]) * np.sin(np.pi * 6 * t) ** 2 * dbfs(-17))
    out["siren 600-1200 Hz"] = ("tones", siren(n) * dbfs(-20))
    out["mains hum 50 Hz, 10 harmonics"] = ("tones", tones(n, [50.0], harmonics=10) * dbfs(-20))
    out["chord C major"] = ("music", tones(n, [261.6, 329.6, 392.0]) * dbfs(-20))
    out["chord progression, 6 harmonics"] = ("music", chord_progression(n) * dbfs(-20))
    out["melody with vibrato, 8 harmonics"] = ("music", melody(n) * dbfs(-20))
    knocks = impacts(n, rng, 2.0, 0.03, [90.0, 250.0])
    out["melody + knocks + pink -40 dBFS"] = ("music", melody(n) * dbfs(-20) + knocks * dbfs(-14) + pink(n, rng) * dbfs(-40))
    out["bursts 300-3400 Hz 150/500 ms"] = ("bursts", gated(band(n, rng, 300, 3400), 0.15, 0.5) * dbfs(-26))
    out["bursts 1-4 kHz 80/500 ms"] = ("bursts", gated(band(n, rng, 1000, 4000), 0.08, 0.5) * dbfs(-26))
    out["bursts 100-800 Hz 300/500 ms"] = ("bursts", gated(band(n, rng, 100, 800), 0.3, 0.5) * dbfs(-20))
    out["speech-shaped noise, 4 Hz syllables"] = ("bursts", syllabic(n, rng) * dbfs(-26))
    out["clicks (typing), 8/s"] = ("impacts", impacts(n, rng, 8.0, 0.004, None) * dbfs(-10))
    out["knocks 150+420 Hz, 3/s"] = ("impacts", impacts(n, rng, 3.0, 0.03, [150.0, 420.0]) * dbfs(-10))
    return {name: (kind, np.clip(x, -1, 1).astype(np.float32)) for name, (kind, x) in out.items()}


