"""Building a test artifact once per test run, however many pytest-xdist workers ask for it.

`make test` runs the suite on two workers (separate processes, each with its own session fixtures).
The tiny checkpoints and their exports cost seconds to a minute each and are the same for every
worker, so they are built in a directory the workers share: the first worker to ask builds under a
lock, the others wait on the lock and then read what it built.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def shared_root(base: Path) -> Path:
    """The directory every worker of this run sees: the parent of a worker's own base temp directory
    (pytest-xdist gives each worker base/../popen-gwN), or `base` itself in a run without workers."""
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(out: Path, build: Callable[[Path], object]) -> Path:
    """`out`, built by `build(out)` unless a worker of this run has built it already. A marker written
    after the build says it finished: a worker that failed halfway leaves no marker, and the next one
    to ask builds it again from nothing."""
    done = out.with_name(out.name + ".built")
    with FileLock(str(out) + ".lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            build(out)
            done.touch()
    return out
