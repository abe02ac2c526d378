#!/usr/bin/env python3
"""What a full collection of Python's cyclic garbage collector costs in a process booted as the
daemon is, with what boot made left in the collector's oldest generation and frozen out of it
(edged/collector.py: the daemon freezes it before READY=1).

    python scripts/bench/collector.py [--artifact DIR] [--repeats 21]

The process imports the daemon's modules, loads the artifact (default: the built-in tiny one) on
the ONNX Runtime backend, claims its buffers and warms it up, as the daemon's boot does. Then
`gc.collect()` runs `--repeats` times as boot left it, and as many times after `freeze_boot()`:
the objects the collector tracks, and the median and worst ms of a full collection, each way. A
full collection runs whenever the collector's counts say so, on the thread that allocated last:
the cohort loop's or the vocoder's, mid-frame.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine


def full_collections(repeats: int) -> tuple[float, float]:
    """(median, worst) ms of `repeats` full collections."""
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), max(ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", default=None, help="an artifact directory (default: the built-in tiny one)")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()

    import edged.daemon  # noqa: F401  (every module the daemon imports)
    from edged.artifact import load_artifact
    from edged.backends import make_backend
    from edged.collector import freeze_boot
    from edged.core import Core

    core = Core(load_artifact(args.artifact), make_backend("onnxruntime", threads=1))
    core.preallocate()
    core.warm_up()
    tracked = len(gc.get_objects())
    median, worst = full_collections(args.repeats)
    before = f"as boot left it: {tracked} objects tracked, a full collection {median:.2f} ms (worst {worst:.2f})"
    frozen = freeze_boot()
    median, worst = full_collections(args.repeats)
    after = (f"frozen: {frozen} objects frozen, {len(gc.get_objects())} tracked, a full collection {median:.3f} ms "
             f"(worst {worst:.3f})")
    core.close()
    print("\n".join([*machine(), before, after]))  # machine() imports torch, which the daemon does not


if __name__ == "__main__":
    main()
