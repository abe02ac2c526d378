"""ONNX Runtime's 8-bit kernels of another x86 CPU, from any x86 machine: a graph run in a child
Python under `qemu-x86_64 -cpu MODEL`, whose CPUID is the model's, so MLAS picks that CPU's kernels
(onnxruntime/core/mlas/lib/platform.cpp reads CPUID and XGETBV at load).

- SATURATING: Haswell (AVX2 and FMA, no VNNI): MLAS's uint8 x int8 kernel is vpmaddubsw, whose pairs of
  products saturate 16-bit sums, as on AMD Zen 2/3 and Intel before Ice Lake.
- EXACT: Nehalem (SSE4.2, no AVX): MLAS's U8X8 SSE kernel widens both sides to 16 bits (pmaddwd into
  32-bit sums): exact on any host, whatever its own kernel does.

Run as a script it is that child: `emulated.py stream GRAPH IN.npz OUT.npz WINDOW` streams the codes of
IN.npz through a vocoder graph in windows (its state carried, as the daemon does), and `emulated.py run
GRAPH IN.npz OUT.npz` runs a graph once on IN.npz's arrays.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

SATURATING = "Haswell-noTSX"
EXACT = "Nehalem"
SNR_DB = 20.0
"""The int8 vocoder's PCM against the fp32 one's, at least (docs/artifact.md: 22-23 dB measured)."""


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(20 * np.log10(np.linalg.norm(reference) / max(float(np.linalg.norm(reference - other)), 1e-12)))


def qemu() -> str | None:
    """qemu-x86_64 where it can run this Python (an x86-64 host), else None."""
    return shutil.which("qemu-x86_64") if platform.machine() == "x86_64" else None


def run_graph(graph: Path, feeds: dict[str, np.ndarray], cpu: str | None, work: Path) -> np.ndarray:
    """The first output of `graph` on `feeds`, under qemu's `cpu` (None: this CPU, in a child all the same)."""
    return _child(cpu, work, "run", graph, feeds)


def stream_vocoder(graph: Path, codes: np.ndarray, state: list[tuple[str, str, tuple[int, ...]]], window: int,
                   cpu: str | None, work: Path) -> np.ndarray:
    """The PCM [1, S] of `codes` [1, G, F] streamed through a vocoder graph in windows of `window` frames,
    its `state` (input, output, shape without batch) carried from window to window."""
    return _child(cpu, work, "stream", graph, {"codes": codes}, json.dumps({"state": state, "window": window}))


def _child(cpu: str | None, work: Path, mode: str, graph: Path, feeds: dict[str, np.ndarray], extra: str = "{}"):
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "in.npz", **feeds)
    prefix = [] if cpu is None else [qemu() or "qemu-x86_64", "-cpu", cpu]
    done = subprocess.run([*prefix, sys.executable, __file__, mode, str(graph), str(work / "in.npz"),
                           str(work / "out.npz"), extra], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{mode} under {cpu or 'this CPU'} failed: {done.stderr[-2000:]}"
    return np.load(work / "out.npz")["out"]


def _main(mode: str, graph: str, inputs: str, out: str, extra: str) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(inputs))
    if mode == "run":
        np.savez(out, out=session.run(None, feeds)[0])
        return
    options = json.loads(extra)
    codes, window = feeds["codes"], options["window"]
    state = {i: np.zeros((1, *shape), np.float32) for i, _, shape in options["state"]}
    parts = []
    for start in range(0, codes.shape[-1], window):
        got = session.run(["pcm", *(o for _, o, _ in options["state"])],
                          {"codes": codes[..., start:start + window], "start": np.array([start], np.int64), **state})
        parts.append(got[0])
        state = {i: value for (i, _, _), value in zip(options["state"], got[1:])}
    np.savez(out, out=np.concatenate(parts, axis=1))


if __name__ == "__main__":
    _main(*sys.argv[1:6])
