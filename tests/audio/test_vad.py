"""Vad (Silero v6 on onnxruntime) and SpeechGate, on real espeak-ng speech and synthetic non-speech.

1. Speech (3 voices, clean and in pink noise at +10 dB SNR) gives one "start", within
   LATENCY_BOUND_MS of the onset, and a "stop" after it ends.
2. Noise, tones, a chord and band-limited bursts give no "start".
3. The per-call protocol is silero's OnnxWrapper (input = the previous frame's last 64 samples +
   this frame, state carried): Vad equals a plain `session.run` loop, bit for bit.
4. reset() restores determinism: the same input after reset gives the same probabilities.
5. Steady-state frames allocate nothing that tracemalloc sees, beyond a bound.
6. The gate's hysteresis on synthetic probability sequences.

The module is skipped only when espeak-ng is not installed (scripts/install-system-deps.sh installs it).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import tracemalloc
import wave

import numpy as np
import pytest
import soxr

from edged.audio import vad as vad_module
from edged.audio.vad import CONTEXT, FRAME, SAMPLE_RATE, SpeechGate, Vad

LATENCY_BOUND_MS = 200
"""Onset to "start" with the default gate (64 ms); measured here: 75-128 ms (bench p90 over 120 clips: 178 ms)."""
LEAD_S = 0.5
TAIL_S = 0.6


def _dbfs(level: float) -> float:
    return float(10 ** (level / 20))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(np.square(x)))


def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(n)) / np.sqrt(np.maximum(np.fft.rfftfreq(n, 1 / SAMPLE_RATE), 20.0))
    return _unit(np.fft.irfft(spectrum, n))


def _frames(x: np.ndarray) -> np.ndarray:
    return x[:len(x) // FRAME * FRAME].reshape(-1, FRAME).astype(np.float32)


@pytest.fixture(scope="module")
def utterances(tmp_path_factory) -> list[tuple[str, np.ndarray, int]]:
    """(label, 16 kHz float32 clip, onset sample) for 3 voices x (clean, pink noise at +10 dB SNR)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/install-system-deps.sh installs it)")
    tmp = tmp_path_factory.mktemp("espeak")
    rng = np.random.default_rng(7)
    clips = []
    for voice, text in [("en-us", "Wait, stop talking please."), ("en-gb+f3", "Excuse me, that is wrong."),
                        ("de", "Halt, das stimmt nicht.")]:
        path = tmp / f"{voice}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
        speech = soxr.resample(pcm, rate, SAMPLE_RATE).astype(np.float64)
        speech *= _dbfs(-26) / np.sqrt(np.mean(np.square(speech[np.abs(speech) > 0.01 * np.abs(speech).max()])))
        onset = int(LEAD_S * SAMPLE_RATE) + int(np.argmax(np.abs(speech) > 0.01 * np.abs(speech).max()))
        clean = np.concatenate([np.zeros(int(LEAD_S * SAMPLE_RATE)), speech, np.zeros(int(TAIL_S * SAMPLE_RATE))])
        noisy = clean + _pink(len(clean), rng) * _dbfs(-36)
        clips += [(f"{voice} clean", clean.astype(np.float32), onset), (f"{voice} pink +10 dB", noisy.astype(np.float32), onset)]
    return clips


@pytest.fixture(scope="module")
def vad() -> Vad:
    return Vad()


def _run(vad: Vad, audio: np.ndarray) -> np.ndarray:
    vad.reset()
    return np.array([vad.probability(frame) for frame in _frames(audio)])


def _events(probs: np.ndarray, gate: SpeechGate) -> list[tuple[int, str]]:
    events = [(i, gate.update(float(p))) for i, p in enumerate(probs)]
    return [(i, e) for i, e in events if e is not None]


def test_speech_starts_within_bound_and_stops(vad, utterances):
    for label, audio, onset in utterances:
        events = _events(_run(vad, audio), SpeechGate())
        assert events, f"{label}: no speech detected"
        first, kind = events[0]
        latency_ms = 1000 * ((first + 1) * FRAME - onset) / SAMPLE_RATE
        print(f"{label}: start {latency_ms:.0f} ms after the onset; events {events}")
        assert kind == "start" and 0 < latency_ms <= LATENCY_BOUND_MS, (label, latency_ms)
        assert events[-1][1] == "stop", f"{label}: no stop after the speech: {events}"


def test_nonspeech_gives_no_start(vad):
    rng = np.random.default_rng(3)
    n = 4 * SAMPLE_RATE
    t = np.arange(n) / SAMPLE_RATE
    band = np.fft.rfft(rng.standard_normal(n))
    band[(np.fft.rfftfreq(n, 1 / SAMPLE_RATE) < 300) | (np.fft.rfftfreq(n, 1 / SAMPLE_RATE) > 3400)] = 0
    bursts = _unit(np.fft.irfft(band, n)) * ((t % 0.5) < 0.15)  # 150 ms on, 350 ms off
    signals = {
        "white -30 dBFS": _unit(rng.standard_normal(n)) * _dbfs(-30),
        "pink -20 dBFS": _pink(n, rng) * _dbfs(-20),
        "tone 440 Hz": _unit(np.sin(2 * np.pi * 440 * t)) * _dbfs(-20),
        "chord C-E-G": _unit(sum(np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0))) * _dbfs(-20),
        "bursts 300-3400 Hz": bursts * _dbfs(-26),
    }
    for label, audio in signals.items():
        probs = _run(vad, audio.astype(np.float32))
        assert _events(probs, SpeechGate()) == [], f"{label}: false start (max p {probs.max():.3f})"
        assert probs.max() < 0.35, f"{label}: max probability {probs.max():.3f}"


def test_matches_silero_protocol(vad, utterances):
    """A plain `session.run` loop, written as silero's OnnxWrapper does it, gives the same probabilities."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(vad_module.model_path()), providers=["CPUExecutionProvider"])
    audio = utterances[1][1]
    context = np.zeros((1, CONTEXT), dtype=np.float32)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    expected = []
    for frame in _frames(audio):
        x = np.concatenate([context, frame[None, :]], axis=1)
        out, state = session.run(None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)})
        context = x[:, -CONTEXT:]
        expected.append(float(out[0, 0]))
    assert np.array_equal(_run(vad, audio), np.array(expected))


def test_reset_restores_determinism(vad, utterances):
    audio = utterances[0][1]
    first = _run(vad, audio)
    for frame in _frames(utterances[3][1]):  # other audio in between leaves state behind ...
        vad.probability(frame)
    carried = np.array([vad.probability(frame) for frame in _frames(audio)])
    assert not np.array_equal(carried, first)
    assert np.array_equal(_run(vad, audio), first)  # ... which reset() clears
    assert np.array_equal(_run(Vad(), audio), first)


def test_steady_state_does_not_allocate(vad):
    """tracemalloc over 2000 frames: growth <= 512 B, peak <= 1 KiB above the start (a frame is 2 KiB).

    ORT's Python binding keeps a pool of ~200 small objects (124 B) that it replaces as it runs;
    blocks allocated before tracing starts are invisible to it, so the pool first shows up as
    ~10 KiB of growth. A traced warm-up turns it over; after that the traced memory is flat.
    """
    frames = (0.1 * np.random.default_rng(5).standard_normal((2000, FRAME))).astype(np.float32)
    vad.reset()
    tracemalloc.start()
    try:
        for frame in frames:  # traced warm-up
            vad.probability(frame)
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for frame in frames:
            vad.probability(frame)
        end, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"growth {end - start} B, peak {peak - start} B over {len(frames)} frames")
    assert end - start <= 512, f"traced memory grew by {end - start} B over {len(frames)} frames"
    assert peak - start <= 1024, f"a frame allocated {peak - start} B at its peak"


def test_frame_size_is_checked(vad):
    with pytest.raises(ValueError, match="512 samples"):
        vad.probability(np.zeros(480, dtype=np.float32))


def test_missing_model_names_the_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="silero-vad"):
        Vad()


# -- the gate, on synthetic probabilities ---------------------------------------------------------

def _feed(gate: SpeechGate, probs: list[float]) -> list[tuple[int, str]]:
    return _events(np.array(probs), gate)


def test_gate_rounds_durations_to_frames():
    gate = SpeechGate(min_speech_ms=64, min_silence_ms=100)
    assert (gate.speech_frames, gate.silence_frames, gate.stop_threshold) == (2, 4, pytest.approx(0.35))
    assert SpeechGate(min_speech_ms=0).speech_frames == 1
    with pytest.raises(ValueError):
        SpeechGate(threshold=0.5, stop_threshold=0.6)


def test_gate_needs_consecutive_speech_to_start():
    gate = SpeechGate(min_speech_ms=64)
    assert _feed(gate, [0.9, 0.1, 0.9, 0.4, 0.6, 0.7]) == [(5, "start")]  # isolated frames do not start
    assert gate.speaking


def test_gate_hysteresis_and_silence_to_stop():
    gate = SpeechGate(min_speech_ms=32, min_silence_ms=96)  # start: 1 frame; stop: 3 quiet frames
    probs = [0.8,  # 0: start
             0.4, 0.4, 0.4, 0.4,  # between the thresholds: still speaking
             0.1, 0.1,  # 5, 6: quiet, 2 of 3
             0.6,  # 7: speech again, the count restarts
             0.1, 0.4, 0.2,  # 8..10: silence began at 8; 9 lies between the thresholds and counts; stop at 10
             0.45, 0.49,  # below the start threshold: no start
             0.5]  # 13: start
    assert _feed(gate, probs) == [(0, "start"), (10, "stop"), (13, "start")]
    gate.reset()
    assert not gate.speaking and _feed(gate, [0.1, 0.1]) == []


def test_without_the_vad_model_the_daemon_serves_without_its_microphone(monkeypatch):
    """A missing silero-vad package disables the microphone (status says why); it does not stop the boot."""
    import edged.audio.vad as vad_module
    from edged.config import Config
    from edged.daemon import Daemon
    from edged.server.events import Events

    def missing() -> None:
        raise FileNotFoundError("the Silero VAD model comes from the 'silero-vad' package, which is not installed")

    monkeypatch.setattr(vad_module, "model_path", missing)
    daemon = Daemon(Config())
    daemon.events, daemon.speaker, daemon.listener_error, daemon.no_portaudio = Events(None), None, "", ""
    assert daemon._listener() is None
    assert "silero-vad" in daemon.listener_error
