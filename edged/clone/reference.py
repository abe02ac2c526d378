"""A reference recording for cloning: checked, mixed to mono and resampled to the model's rate.

The reference's clone prompt takes 24 kHz mono float PCM; other rates are resampled here with
soxr (the reference resamples with librosa: the two agree closely, not bit for bit). Limits are
the daemon's (`voices.min_reference_ms` / `max_reference_ms`): a reference shorter than the speaker
encoder can summarize, or longer than the buffers claimed at boot, is refused with a reason.
"""

from __future__ import annotations

import numpy as np

MIN_RATE, MAX_RATE = 8000, 192000
MIN_REFERENCE_MS, MAX_REFERENCE_MS = 1000, 30000
"""The default limits: a second is the least the speaker encoder summarizes well; 30 s is what the
clone encoder's buffers are claimed for."""


class BadReference(ValueError):
    """A reference recording that cannot be used; the message says why."""


def reference_pcm(pcm: np.ndarray, rate: int, model_rate: int, *, min_ms: int, max_ms: int) -> np.ndarray:
    """`pcm` (float32 mono, or [n, channels]) at `rate` -> float32 mono at `model_rate`, checked."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise BadReference(f"reference sample_rate {rate} is outside {MIN_RATE}..{MAX_RATE} Hz")
    pcm = np.asarray(pcm)
    if pcm.ndim == 2:
        pcm = pcm.mean(axis=1)
    if pcm.ndim != 1 or pcm.dtype.kind != "f":
        raise BadReference(f"reference audio must be float samples, mono or [n, channels] (got {pcm.dtype}, "
                             f"shape {list(pcm.shape)})")
    ms = len(pcm) * 1000 // rate
    if ms < min_ms or ms > max_ms:
        raise BadReference(f"reference is {ms} ms long; a reference must be {min_ms}..{max_ms} ms")
    if not np.isfinite(pcm).all():
        raise BadReference("reference audio has non-finite samples")
    if not np.abs(pcm).max() > 1e-4:
        raise BadReference("reference audio is silent")
    pcm = pcm.astype(np.float32)
    if rate != model_rate:
        import soxr

        pcm = soxr.resample(pcm, rate, model_rate, quality="HQ").astype(np.float32)
    return pcm
