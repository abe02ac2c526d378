"""The cyclic garbage collector and the step path: what boot made is frozen out of full collections.

Everything the daemon builds at boot (modules, engines, plans, buffers) lives as long as it does.
Left in the collector's oldest generation, each full collection walks all of it, on whatever
thread allocated last: on the built-in tiny artifact about 39 k objects and 11 ms on one x86 core
(docs/dev/performance.md), a stall the cohort loop or the vocoder's thread would take mid-frame.
Frozen (`gc.freeze`), full collections walk only what came after boot.
"""

from __future__ import annotations

import gc


def freeze_boot() -> int:
    """Collect what boot threw away, then freeze the rest; the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def collector_status() -> dict[str, int]:
    """`status.collector`: objects frozen at boot, and full collections since the process began."""
    return {"frozen": gc.get_freeze_count(), "full_collections": gc.get_stats()[2]["collections"]}
