"""WAV files: 16-bit PCM, mono, with the stdlib `wave` module."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def write_wav(path: Path | str, pcm: np.ndarray, sample_rate: int) -> None:
    """pcm: float32 in [-1, 1] -> 16-bit little-endian PCM."""
    samples = np.clip(np.round(pcm * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(samples.tobytes())


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    """16-bit mono WAV -> (float32 samples, sample rate)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono WAV")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return data.astype(np.float32) / 32767.0, w.getframerate()
