"""The rate policy's heard prefix for plain English texts, stated apart from the daemon's code: a
unit is a run of ASCII letters and digits, apostrophes inside it kept (edged/history/text.py states
the general rule, CJK and Unicode included; these texts do not reach it)."""

from __future__ import annotations

import math
import re

MS_PER_UNIT = 250.0
GUARD_MS = 160
RATE_CONFIG = f'[history]\npolicy = "rate"\ndefault_ms_per_unit = {MS_PER_UNIT}\n'
_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z0-9]+)*")


def expected_prefix(text: str, played_ms: float) -> str:
    """Whole words heard after the guard, less one; the text up to the end of the last one kept."""
    assert text.isascii() and "_" not in text, f"not a plain English text: {text!r}"
    ends = [m.end() for m in _WORD.finditer(text)]
    count = min(len(ends), math.floor(max(0.0, played_ms - GUARD_MS) / MS_PER_UNIT))
    return text[:ends[count - 2]] if count >= 2 else ""
