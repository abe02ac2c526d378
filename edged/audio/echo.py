"""Echo cancellation: remove the daemon's own voice from the microphone before the VAD hears it.

The daemon knows what it played: the speaker's tap holds every sample sent to the DAC, and the
listener reads it as a second stream beside the microphone's, just behind the newest tapped
sample, so the echo always lags its reference. What is left for this module is the echo path: a
delay (estimated, 0..max_delay_s) and a filter (learned).

- Delay: GCC-PHAT between the last second of microphone and reference, searched over
  [0, max_delay_s]; re-estimated every half second while the reference carries sound, and taken only
  when its peak stands clear of the rest (a clear, repeatable alignment).
- Filter: per STFT bin (sqrt-Hann, 50% overlap, hop = block), one complex tap from exponentially
  averaged cross- and auto-spectra, H = S_mx / S_xx (a Wiener estimate). The user's speech is
  uncorrelated with the reference, so double talk adds noise to S_mx but does not bias it: no
  double-talk detector is needed to keep the filter from diverging, unlike an NLMS canceller.
- Output: the residual M - H X, resynthesized by overlap-add; one block out per block in, one block
  of delay.
- Rollback: the user's speech does not bias the averages, but it does add variance. The VAD
  recognizes speech only some time after it begins (the listener then holds the filter), so the
  filter is checkpointed every CHECKPOINT_S. `rollback` restores the filter as it was about
  rollback_s ago, from before the double talk began. Without this, the next reply would start
  against a noisy filter, and its first few hundred ms of echo could sound like the user.
  It rolls back only when the reference has been sounding, without a pause of QUIET_S, for the
  whole of rollback_s. The checkpoint was then learned on this same echo. Earlier in a reply, what
  the filter learned is mostly the reply's own echo, and restoring the filter from before the reply
  would throw it away. A filter still converging could then cut every reply early and never learn.

All arrays are allocated at construction; `process` writes into them.
"""

from __future__ import annotations

import numpy as np

CHECKPOINT_S = 0.05
"""Interval between checkpoints of the filter (and its delay and ERLE) that `rollback` restores."""
QUIET_S = 0.2
"""A pause in the reference this long ends a stretch of sound (replies have shorter pauses)."""


class EchoCanceller:
    def __init__(self, rate: int, block: int, max_delay_s: float = 0.5, smoothing_s: float = 0.3,
                 history_s: float = 1.0, rollback_s: float = 0.5) -> None:
        self.rate, self.block = rate, block
        self.frame = 2 * block
        self.window = np.sqrt(np.hanning(self.frame + 1)[:-1]).astype(np.float32)  # periodic sqrt-Hann
        bins = block + 1
        self.max_lag = int(max_delay_s * rate)
        self.alpha = float(np.exp(-block / (smoothing_s * rate)))
        # the reference history must reach back max_lag plus one frame
        self.ref = np.zeros(self.max_lag + 4 * block, dtype=np.float32)
        self.mic = np.zeros(2 * block, dtype=np.float32)
        self.out = np.zeros(2 * block, dtype=np.float32)
        self.s_mx = np.zeros(bins, dtype=np.complex128)
        self.s_xx = np.full(bins, 1e-9, dtype=np.float64)
        self.lag = 0
        self.lags_found = 0
        self.hist = max(int(history_s * rate) // block * block, 4 * block)
        self.mic_hist = np.zeros(self.hist, dtype=np.float32)
        self.ref_hist = np.zeros(self.hist + self.max_lag, dtype=np.float32)
        self.blocks = 0
        self.sound_blocks = 0
        n = 1 << int(np.ceil(np.log2(self.hist + self.ref_hist.shape[0])))
        self.nfft = n
        self.erle_db = 0.0
        """Echo return loss enhancement over the last blocks with sound in the reference (dB)."""
        self._e_mic = 1e-12
        self._e_res = 1e-12
        self.every = max(1, round(CHECKPOINT_S * rate / block))
        """Blocks between checkpoints; the ring holds rollback_s of them, the oldest is restored."""
        slots = max(2, int(np.ceil(rollback_s * rate / (block * self.every))) + 1)
        self.saved_mx = np.zeros((slots, bins), dtype=np.complex128)
        self.saved_xx = np.full((slots, bins), 1e-9, dtype=np.float64)
        self.saved = np.zeros((slots, 4), dtype=np.float64)
        """Per checkpoint: lag, erle_db, _e_mic, _e_res."""
        self.checkpoints = 0
        self.quiet_blocks = self.sounding_blocks = 0
        """Consecutive blocks without sound in the reference; blocks since its sound resumed."""
        self.quiet_limit = max(1, round(QUIET_S * rate / block))
        self.rollback_blocks = int(np.ceil(rollback_s * rate / block))

    def reset(self) -> None:
        """Forget the echo path (a new device): filter, delay and histories."""
        for a in (self.ref, self.mic, self.out, self.mic_hist, self.ref_hist):
            a[:] = 0.0
        self.s_mx[:] = 0.0
        self.s_xx[:] = 1e-9
        self.lag = self.lags_found = self.blocks = self.sound_blocks = 0
        self.checkpoints = self.quiet_blocks = self.sounding_blocks = 0

    def shift(self, samples: int) -> None:
        """The reference stream moved by `samples` against the microphone (the listener realigned
        it): move the delay with it and keep the learned filter, when the delay stays in range."""
        lag = self.lag + samples
        if 0 <= lag <= self.max_lag:
            self.lag = lag
        else:
            self.s_mx[:] = 0.0
            self.s_xx[:] = 1e-9
            self.lag = min(max(lag, 0), self.max_lag)
        self.checkpoints = 0  # older filters belong to the old alignment

    def rollback(self) -> None:
        """Restore the filter, its delay and ERLE as they were rollback_s ago (or at the oldest
        checkpoint since the last reset, shift or rollback): before double talk began."""
        if self.checkpoints == 0 or self.sounding_blocks < self.rollback_blocks:
            return
        slots = len(self.saved)
        oldest = self.checkpoints % slots if self.checkpoints >= slots else 0
        self.s_mx[:] = self.saved_mx[oldest]
        self.s_xx[:] = self.saved_xx[oldest]
        lag, self.erle_db, self._e_mic, self._e_res = self.saved[oldest]
        self.lag = int(lag)
        self.checkpoints = 0

    def process(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray, adapt: bool = True) -> None:
        """One block: `mic` and `ref` (len == block) in, the residual out (the previous block's).
        adapt=False (the user is speaking) holds the filter: double talk cannot bias its average,
        but it adds variance the averages take ~smoothing_s to forget."""
        b = self.block
        self.ref[:-b] = self.ref[b:]
        self.ref[-b:] = ref
        self.mic_hist[:-b] = self.mic_hist[b:]
        self.mic_hist[-b:] = mic
        self.ref_hist[:-b] = self.ref_hist[b:]
        self.ref_hist[-b:] = ref
        self.blocks += 1
        sound = float(np.dot(ref, ref)) > 1e-7 * b
        self.quiet_blocks = 0 if sound else self.quiet_blocks + 1
        self.sounding_blocks = 0 if self.quiet_blocks >= self.quiet_limit else self.sounding_blocks + 1
        if sound:
            self.sound_blocks += 1
            if self.sound_blocks % max(1, self.rate // (2 * b)) == 0:
                self._estimate_lag()

        self.mic[:b] = self.mic[b:]
        self.mic[b:] = mic
        m = np.fft.rfft(self.mic * self.window)
        end = len(self.ref) - self.lag
        x = np.fft.rfft(self.ref[end - self.frame:end] * self.window)
        if sound and adapt:
            a = self.alpha
            self.s_mx *= a
            self.s_mx += (1 - a) * m * np.conj(x)
            self.s_xx *= a
            self.s_xx += (1 - a) * (x.real ** 2 + x.imag ** 2)
        e = m - (self.s_mx / self.s_xx) * x
        y = np.fft.irfft(e, self.frame).astype(np.float32) * self.window
        out[:] = self.out[b:] + y[:b]
        self.out[:b] = 0.0
        self.out[b:] = y[b:]
        if sound:
            self._e_mic = 0.95 * self._e_mic + 0.05 * float(np.dot(mic, mic))
            self._e_res = 0.95 * self._e_res + 0.05 * float(np.dot(out, out))
            self.erle_db = float(10 * np.log10(self._e_mic / max(self._e_res, 1e-12)))
        if self.blocks % self.every == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        slot = self.checkpoints % len(self.saved)
        self.saved_mx[slot] = self.s_mx
        self.saved_xx[slot] = self.s_xx
        row = self.saved[slot]
        row[0], row[1], row[2], row[3] = self.lag, self.erle_db, self._e_mic, self._e_res
        self.checkpoints += 1

    def _estimate_lag(self) -> None:
        """GCC-PHAT over the histories: the lag (>= 0) at which the microphone best follows the reference."""
        n = self.nfft
        mic = np.fft.rfft(self.mic_hist, n)
        ref = np.fft.rfft(self.ref_hist, n)
        cross = mic * np.conj(ref)
        cross /= np.abs(cross) + 1e-12
        cc = np.fft.irfft(cross, n)
        # cc[k] = sum_i mic_hist[i + k] ref_hist[i]; an echo mic(t) = ref(t - L) pairs mic_hist[i]
        # with ref_hist[i + max_lag - L], so lag L in [0, max_lag] peaks at k = L - max_lag (mod n)
        lags = np.concatenate([cc[n - self.max_lag:], cc[:1]])
        peak = int(np.argmax(lags))
        height = lags[peak]
        rest = np.delete(lags, slice(max(0, peak - 8), peak + 9))
        if height > 6 * (np.std(rest) + 1e-12) and height > 0.05:
            lag = peak
            if lag != self.lag:
                self.s_mx[:] = 0.0  # a new alignment: learn the filter again
                self.s_xx[:] = 1e-9
            self.lag = lag
            self.lags_found += 1
