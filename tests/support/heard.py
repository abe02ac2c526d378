"""The rate policy's heard prefix, stated independently of the daemon's code."""

from __future__ import annotations

import math

from edged.history.text import units

MS_PER_UNIT = 250.0
GUARD_MS = 160
RATE_CONFIG = f'[history]\npolicy = "rate"\ndefault_ms_per_unit = {MS_PER_UNIT}\n'


def expected_prefix(text: str, played_ms: float) -> str:
    """Whole units heard after the guard, less one."""
    count = min(len(units(text)), math.floor(max(0.0, played_ms - GUARD_MS) / MS_PER_UNIT))
    kept = units(text)[:max(0, count - 1)]
    return text[:kept[-1].end] if kept else ""
