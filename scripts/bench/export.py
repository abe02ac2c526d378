#!/usr/bin/env python3
"""Full-size exports: real-dimension random checkpoints saved as the published ones are (bf16 shards
and model.safetensors.index.json), exported with their peak resident memory and time, turned into
each weight form, and spoken from with `edged synth`.

    python scripts/bench/export.py [--work DIR] [--cases tts-0.6b,tts-1.7b,omni-20] [--forms fp32,fp16,...]
                                   [--frames 24] [--keep]

Cases: tts-0.6b and tts-1.7b (Qwen3-TTS-12Hz CustomVoice), omni-20 (Qwen3-Omni-30B-A3B's talker at
all 20 layers, its code predictor and code2wav, the thinker's embedding at its real size). Each
step runs as its own process, measured from outside (os.wait4: peak resident memory, wall time),
holding /tmp/edged-heavy.lock only while it runs: building the checkpoint (`edged-engines tiny`),
`edged-engines export`, each form from the fp32 artifact (`edged-engines fp16` / `quantize`), and
`edged synth` (greedy, --frames frames) on every form. Every command is printed as it was run.
Checkpoints and artifacts are deleted after their case unless --keep (the disk is shared).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import machine

BIN = Path(sys.executable).parent
LOCK = Path("/tmp/edged-heavy.lock")
CASES = {
    "tts-0.6b": {"tiny": ["--family", "qwen3_tts", "--variant", "0.6b", "--dtype", "bf16", "--shard-size", "1GB"],
                 "voice": ["--speaker", "vivian", "--language", "english"], "forms": "fp32,fp16,int8,int4"},
    "tts-1.7b": {"tiny": ["--family", "qwen3_tts", "--variant", "1.7b", "--dtype", "bf16", "--shard-size", "1GB"],
                 "voice": ["--speaker", "vivian", "--language", "english"], "forms": "fp32,fp16,int8,int4"},
    "omni-20": {"tiny": ["--family", "qwen3_omni", "--variant", "real", "--layers", "20", "--dtype", "bf16",
                         "--shard-size", "2GB"], "voice": ["--speaker", "ethan"], "forms": "fp32"},
}
FORMS = {"fp16": ["fp16"], "int8": ["quantize", "--weights", "int8"], "int4": ["quantize", "--weights", "int4"]}
TEXT = "Hello world, this is edged speaking from a full-size export."


@dataclass
class Step:
    case: str
    what: str
    command: list[str]
    seconds: float
    peak_gib: float
    size_gib: float | None = None
    note: str = ""


@contextmanager
def heavy():
    """The shared lock for heavy work, held while one step runs."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure(case: str, what: str, command: list[str], out: Path | None = None) -> Step:
    """Run `command` as its own process under the lock: wall time and peak resident memory."""
    print(f"$ {shlex.join(command)}", flush=True)
    with heavy():
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{what} failed ({os.waitstatus_to_exitcode(status)}): {shlex.join(command)}")
    step = Step(case, what, command, seconds, usage.ru_maxrss / 2**20, size(out) if out else None, output.strip())
    print(f"  {seconds:.1f} s, peak RSS {step.peak_gib:.2f} GiB" +
          (f", {step.size_gib:.2f} GiB on disk" if step.size_gib is not None else ""), flush=True)
    return step


def size(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**30


def spoke(wav: Path, report: str) -> str:
    """What `edged synth` made: frames, RTF and the level of its audio (random weights, so a level)."""
    with wave.open(str(wav)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
    result = json.loads(report.splitlines()[-1])
    return f"{result['frames']} frames, RTF {result['rtf']:.2f}, RMS {np.sqrt(np.mean(pcm ** 2)):.3f}"


def run_case(name: str, work: Path, forms: list[str], frames: int, keep: bool) -> list[Step]:
    spec = CASES[name]
    ckpt, fp32 = work / f"ckpt-{name}", work / f"art-{name}-fp32"
    steps = [measure(name, "checkpoint", [str(BIN / "edged-engines"), "tiny", *spec["tiny"], "--out", str(ckpt)], ckpt)]
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    steps[-1].note = f"{len(shards)} shards + index" if (ckpt / "model.safetensors.index.json").is_file() else shards[0]
    steps.append(measure(name, "export fp32", [str(BIN / "edged-engines"), "export", "--checkpoint", str(ckpt),
                                               "--out", str(fp32), "--max-batch", "4", "--max-seq", "1024"], fp32))
    if not keep:
        shutil.rmtree(ckpt)
    artifacts = {"fp32": fp32}
    for form in forms:
        if form == "fp32":
            continue
        artifacts[form] = work / f"art-{name}-{form}"
        steps.append(measure(name, f"form {form}", [str(BIN / "edged-engines"), *FORMS[form], "--artifact", str(fp32),
                                                    "--out", str(artifacts[form])], artifacts[form]))
    for form in forms:
        wav = work / f"{name}-{form}.wav"
        step = measure(name, f"synth {form}", [str(BIN / "edged"), "synth", "--artifact", str(artifacts[form]),
                                               "--text", TEXT, *spec["voice"], "--greedy", "--max-frames", str(frames),
                                               "--threads", "generation=1,vocoder=1", "--out", str(wav)])
        step.note = spoke(wav, step.note)
        steps.append(step)
    if not keep:
        for path in artifacts.values():
            shutil.rmtree(path)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edged-bench-export")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--forms", default=None, help="weight forms (default: each case's own list)")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--keep", action="store_true", help="keep checkpoints and artifacts")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for line in machine():
        print(line)
    steps = []
    for name in args.cases.split(","):
        forms = (args.forms or CASES[name]["forms"]).split(",")
        steps += run_case(name, args.work, forms, args.frames, args.keep)
    print("\n| case | step | wall s | peak RSS GiB | on disk GiB | notes |\n|---|---|---|---|---|---|")
    for s in steps:
        disk = "" if s.size_gib is None else f"{s.size_gib:.2f}"
        note = s.note if not s.what.startswith(("export", "form")) else ""
        print(f"| {s.case} | {s.what} | {s.seconds:.1f} | {s.peak_gib:.2f} | {disk} | {note} |")


if __name__ == "__main__":
    main()
