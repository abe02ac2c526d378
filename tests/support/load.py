"""Load beside the daemon, at the default priority, for the tests and benches that claim the audio
path keeps its deadlines on a busy machine: `busy` processes spinning on a core each (a
transcription server's or an application's CPU work), `memory` processes streaming through arrays
far larger than the caches (what an LLM's host side and memory-bound kernels do to the memory bus).
Processes, not threads: each is its own interpreter, so none holds this process's GIL."""

from __future__ import annotations

import os
import subprocess
import sys

BUSY = "while True:\n    pass\n"
MEMORY = ("import numpy as np\n"
          "a = np.ones(32 << 20, np.float32)\n"  # 128 MiB each way: far past any cache
          "b = np.empty_like(a)\n"
          "while True:\n    np.copyto(b, a)\n    np.copyto(a, b)\n")


class Load:
    """A context manager: `busy` spinning processes and `memory` streaming ones, all at nice 0."""

    def __init__(self, busy: int = 0, memory: int = 0) -> None:
        self.busy, self.memory = busy, memory
        self.procs: list[subprocess.Popen] = []

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.busy, "busy"), (self.memory, "memory-bound")) if n]
        return ", ".join(parts) + f" process(es) on {os.cpu_count()} cores" if parts else "idle"

    def __enter__(self) -> Load:
        for code, n in ((BUSY, self.busy), (MEMORY, self.memory)):
            for _ in range(n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                                   preexec_fn=lambda: os.sched_setscheduler(
                                                       0, os.SCHED_OTHER, os.sched_param(0))))
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()
