"""The maintained echo cancellers that edged's is measured against, behind one interface.

- `Speex`: speexdsp's MDF (partitioned frequency-domain filter) with the residual echo suppressor of
  its preprocessor, through ctypes on libspeexdsp (Debian and Ubuntu: libspeexdsp1). The PyPI
  binding does not expose the suppressor.
- `Aec3`: WebRTC's AEC3 through `pywebrtc-audio` (AudioProcessor at 24 kHz, echo cancellation only,
  its defaults: the package exposes no suppressor settings).
- `Edged`: edged's own `EchoCanceller`.
- `SingleTap`: the canceller of edged's previous release, for reference: GCC-PHAT delay and one
  complex Wiener tap per STFT bin (512-sample frames, 256 hop: 10.7 ms of echo path at 24 kHz).

Each takes blocks of the microphone and the reference (the loudspeaker's input, read ahead of the
echo by the bulk latency) and returns a block of output; `delay` is how many samples the output
lags the input.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

SPEEX_ECHO_SET_SAMPLING_RATE = 24  # speex/speex_echo.h
SPEEX_PREPROCESS_SET_ECHO_STATE = 24  # speex/speex_preprocess.h


class Delay:
    """A block-wise delay line: `samples` of delay."""

    def __init__(self, samples: int, block: int) -> None:
        self.buf = np.zeros(samples + block, np.float32)
        self.block = block

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.buf[:-self.block] = self.buf[self.block:]
        self.buf[-self.block:] = x
        return self.buf[:self.block].copy()


class Speex:
    name = "speexdsp MDF + suppressor"

    def __init__(self, rate: int, block: int, tail_s: float = 0.3, bulk: int = 0) -> None:
        path = ctypes.util.find_library("speexdsp")
        if path is None:
            raise RuntimeError("libspeexdsp is not installed (apt: libspeexdsp1)")
        lib = self.lib = ctypes.CDLL(path)
        lib.speex_echo_state_init.restype = ctypes.c_void_p
        lib.speex_preprocess_state_init.restype = ctypes.c_void_p
        lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 3
        lib.speex_preprocess_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.speex_echo_ctl.argtypes = lib.speex_preprocess_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.block, self.delay = block, 0
        self.ref_delay = Delay(max(0, bulk - block), block)  # speex's filter spans the room, not the latency
        self.echo = lib.speex_echo_state_init(block, int(tail_s * rate) + block)
        self.pre = lib.speex_preprocess_state_init(block, rate)
        r = ctypes.c_int(rate)
        lib.speex_echo_ctl(self.echo, SPEEX_ECHO_SET_SAMPLING_RATE, ctypes.byref(r))
        lib.speex_preprocess_ctl(self.pre, SPEEX_PREPROCESS_SET_ECHO_STATE, ctypes.c_void_p(self.echo))
        # at its defaults: echo suppression -40 dB (-15 dB while the near end talks); its gains apply
        # only with denoise on (preprocess.c), which is its default too
        self.mic = np.zeros(block, np.int16)
        self.ref = np.zeros(block, np.int16)
        self.out = np.zeros(block, np.int16)

    def process(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        self.mic[:] = np.clip(mic * 32767, -32768, 32767)
        self.ref[:] = np.clip(self.ref_delay(ref) * 32767, -32768, 32767)
        self.lib.speex_echo_cancellation(self.echo, self.mic.ctypes.data, self.ref.ctypes.data, self.out.ctypes.data)
        self.lib.speex_preprocess_run(self.pre, self.out.ctypes.data)
        return self.out.astype(np.float32) / 32767


class Aec3:
    name = "WebRTC AEC3 (defaults)"

    def __init__(self, rate: int, block: int, bulk: int = 0) -> None:
        from pywebrtc_audio import AudioProcessor

        self.apm = AudioProcessor(sample_rate=rate, echo_cancellation=True, stream_delay_ms=int(bulk * 1000 / rate))
        self.chunk = rate // 100  # it takes 10 ms chunks
        self.block, self.delay = block, self.chunk
        self.mic_in = np.zeros(0, np.float32)
        self.ref_in = np.zeros(0, np.float32)
        self.out = np.zeros(self.chunk, np.float32)  # one chunk of lead so every block has output

    def process(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        self.mic_in = np.concatenate([self.mic_in, mic])
        self.ref_in = np.concatenate([self.ref_in, ref])
        outs = [self.out]
        while len(self.mic_in) >= self.chunk:
            c = self.chunk
            outs.append(np.asarray(self.apm.process(self.mic_in[:c].copy(), self.ref_in[:c].copy()), np.float32))
            self.mic_in, self.ref_in = self.mic_in[c:], self.ref_in[c:]
        joined = np.concatenate(outs)
        self.out = joined[self.block:]
        return joined[:self.block]


class Edged:
    def __init__(self, rate: int, block: int, bulk: int = 0, **options) -> None:
        from edged.audio.echo import EchoCanceller

        self.canceller = EchoCanceller(rate, block, latency=bulk, **options)
        self.name = "edged"
        self.block, self.delay = block, self.canceller.delay
        self.out = np.zeros(block, np.float32)

    def process(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        self.canceller.process(mic, ref, self.out)
        return self.out.copy()


class SingleTap:
    name = "single tap per bin (previous release)"

    def __init__(self, rate: int, block: int, bulk: int = 0, smoothing_s: float = 0.3, max_delay_s: float = 0.5) -> None:
        self.block, self.delay, self.rate = block, block, rate
        self.window = np.sqrt(np.hanning(2 * block + 1)[:-1])
        self.alpha = float(np.exp(-block / (smoothing_s * rate)))
        self.max_lag = int(max_delay_s * rate)
        self.ref = np.zeros(self.max_lag + 4 * block)
        self.mic = np.zeros(2 * block)
        self.tail = np.zeros(block)
        self.s_mx = np.zeros(block + 1, np.complex128)
        self.s_xx = np.full(block + 1, 1e-9)
        self.lag, self.sound = 0, 0
        self.hist = np.zeros(rate)
        self.ref_hist = np.zeros(rate + self.max_lag)

    def process(self, mic: np.ndarray, ref: np.ndarray) -> np.ndarray:
        b = self.block
        for buf, x in ((self.ref, ref), (self.mic, mic), (self.hist, mic), (self.ref_hist, ref)):
            buf[:-b] = buf[b:]
            buf[-b:] = x
        if np.dot(ref, ref) > 1e-7 * b:
            self.sound += 1
            if self.sound % (self.rate // (2 * b)) == 0:
                self._estimate_lag()
            adapt = True
        else:
            adapt = False
        m = np.fft.rfft(self.mic * self.window)
        end = len(self.ref) - self.lag
        x = np.fft.rfft(self.ref[end - 2 * b:end] * self.window)
        if adapt:
            self.s_mx = self.alpha * self.s_mx + (1 - self.alpha) * m * np.conj(x)
            self.s_xx = self.alpha * self.s_xx + (1 - self.alpha) * np.abs(x) ** 2
        y = np.fft.irfft(m - self.s_mx / self.s_xx * x, 2 * b) * self.window
        out = self.tail + y[:b]
        self.tail = y[b:]
        return out.astype(np.float32)

    def _estimate_lag(self) -> None:
        n = 1 << int(np.ceil(np.log2(len(self.hist) + len(self.ref_hist))))
        cross = np.fft.rfft(self.hist, n) * np.conj(np.fft.rfft(self.ref_hist, n))
        cc = np.fft.irfft(cross / (np.abs(cross) + 1e-12), n)
        lags = np.concatenate([cc[n - self.max_lag:], cc[:1]])
        peak = int(np.argmax(lags))
        rest = np.delete(lags, slice(max(0, peak - 8), peak + 9))
        if lags[peak] > 6 * (np.std(rest) + 1e-12) and lags[peak] > 0.05 and peak != self.lag:
            self.lag = peak
            self.s_mx[:] = 0.0
            self.s_xx[:] = 1e-9
