"""The soak (scripts/soak.py), shorter: 150 mixed requests (whole, streamed text, cancelled, clients
vanishing mid-stream, history) through the real daemon; after warm-up its file descriptors and
threads do not grow at all, and its resident memory levels off: over the second half of the requests
it grows by at most the KiB per request docs/dev/performance.md states."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import soak

KIB_PER_REQUEST = 8
"""Growth of the second half, per request: 1.6-2.8 KiB here (the history's in-memory records, up to
4096 replies, still filling); a reply's kept report or audio would be tens of KiB."""


def test_a_short_soak_holds_memory_fds_and_threads(tmp_path):
    proc, endpoint = soak.start_daemon(tmp_path, None)
    try:
        result = soak.soak(endpoint, proc.pid, requests=150, clients=4, seed=1)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    start, half, end, outcomes = result["start"], result["half"], result["end"], result["outcomes"]
    assert end["fds"] <= start["fds"] and end["threads"] <= start["threads"], (start, end)
    assert (end["rss"] - half["rss"]) / 75 <= KIB_PER_REQUEST << 10, (start, half, end)
    kinds = {kind for kind, _ in outcomes}
    assert kinds == set(soak.KINDS), outcomes
    assert {o for (k, o) in outcomes if k == "cancelled"} == {"cancelled"}
    assert {o for (k, o) in outcomes if k in ("whole", "streamed")} <= {"length", "eos"}
