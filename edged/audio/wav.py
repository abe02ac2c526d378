"""WAV files and 16-bit PCM: one place for every conversion the daemon and its tools make."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np


def to_s16(pcm: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] (clipped) -> 16-bit little-endian samples."""
    return np.rint(np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")


def from_s16(data: bytes | np.ndarray) -> np.ndarray:
    """16-bit little-endian samples -> float32 (the inverse of `to_s16`: divided by 32767)."""
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0


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
    """A PCM WAV file (8-, 16-, 24- or 32-bit integer samples, any channel count) -> (float32 mono
    samples in [-1, 1], the channels averaged; sample rate). Raises ValueError naming what is wrong."""
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{path}: not a PCM WAV file ({exc})") from exc
    if width == 1:
        data = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        data = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8).astype(np.float32) / 8388608.0
    elif width == 2:
        data = from_s16(raw)
    elif width == 4:
        data = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    else:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported (8, 16, 24 or 32-bit PCM)")
    return data.reshape(-1, channels).mean(axis=1, dtype=np.float32), rate
