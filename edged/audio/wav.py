"""WAV files and 16-bit PCM: one place for every conversion the daemon and its tools make."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np


def to_s16(pcm: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] (clipped) -> 16-bit little-endian samples."""
    return np.rint(np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")


def wav_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    """float32 mono PCM in [-1, 1] (clipped) -> a 16-bit mono WAV file."""
    if pcm.ndim != 1 or sample_rate <= 0:
        raise ValueError(f"wav_bytes needs mono PCM and a positive rate (shape {pcm.shape}, rate {sample_rate})")
    if not np.isfinite(pcm).all():
        raise ValueError("wav_bytes: PCM has non-finite samples")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_s16(pcm).tobytes())
    return out.getvalue()


def write_wav(path: Path | str, pcm: np.ndarray, sample_rate: int) -> None:
    """float32 mono PCM in [-1, 1] (clipped) -> a 16-bit mono WAV file at `path`."""
    Path(path).write_bytes(wav_bytes(pcm, sample_rate))


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    """16-bit mono WAV -> (float32 samples, sample rate)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono WAV")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return data.astype(np.float32) / 32767.0, w.getframerate()
