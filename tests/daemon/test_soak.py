"""The soak (scripts/soak.py), shorter: 150 mixed requests (whole, streamed text, cancelled, clients
vanishing mid-stream, history) through the real daemon; after warm-up its file descriptors and
threads do not grow at all and its resident memory by at most the bound docs/performance.md states."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import soak

RSS_GROWTH_BOUND = 16 << 20


def test_a_short_soak_holds_memory_fds_and_threads(tmp_path):
    proc, endpoint = soak.start_daemon(tmp_path, None)
    try:
        result = soak.soak(endpoint, proc.pid, requests=150, clients=4, seed=1)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    start, end, outcomes = result["start"], result["end"], result["outcomes"]
    assert end["fds"] <= start["fds"] and end["threads"] <= start["threads"], (start, end)
    assert end["rss"] - start["rss"] <= RSS_GROWTH_BOUND, (start, end)
    kinds = {kind for kind, _ in outcomes}
    assert kinds == set(soak.KINDS), outcomes
    assert {o for (k, o) in outcomes if k == "cancelled"} == {"cancelled"}
    assert {o for (k, o) in outcomes if k in ("whole", "streamed")} <= {"length", "eos"}
