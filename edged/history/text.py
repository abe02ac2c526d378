"""What the user heard of a spoken reply, as an offset into its ORIGINAL text.

The rules are vllm-omni's duplex history calibration (Qwen3-Omni `duplex/history.py`: `text_units`,
`asr_prefix`; `duplex/history_rate.py`: the token-rate estimate), as the heard-text notes §3.2-3.3
describe them. A transcript or a speaking rate is evidence only: every function here returns an
exclusive character offset into the original text, which the caller slices; nothing else is stored.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

# A unit is one CJK character or one word; words exclude CJK so "AI今天" is AI, 今, 天.
_CJK = "\u3400-\u9fff"
_UNIT = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+(?:['’][^\W_{_CJK}]+)*")
# An ASR edit touching these may flip the meaning: a dropped negation, a misheard number.
_NEGATIONS = frozenset({"不", "没", "无", "非", "别", "勿", "未", "not", "no", "never", "cannot", "don't", "can't"})


@dataclass(frozen=True)
class Unit:
    """One text unit: its normalized form and its span [start, end) in the original text."""

    norm: str
    """NFKC + casefold, with ’ as '."""
    start: int
    end: int


def units(text: str) -> list[Unit]:
    """The CJK characters and words of `text`, each normalized on its own so offsets stay original."""
    return [Unit(_normalize(m.group()), m.start(), m.end()) for m in _UNIT.finditer(text)]


def unit_count(text: str) -> int:
    """How many units `text` has (the unit of the daemon's speaking rate)."""
    return len(units(text))


def word_cut(original: str, offset: int) -> int:
    """`offset` moved back to the end of the last whole unit ending at or before it (0 if none)."""
    if not 0 <= offset <= len(original):
        raise ValueError(f"offset {offset} outside the text (0..{len(original)})")
    return max((u.end for u in units(original) if u.end <= offset), default=0)


def rate_prefix(original: str, heard_ms: float, ms_per_unit: float, *, withhold: int = 1) -> int:
    """End offset of the units heard at a fixed speaking rate, the last `withhold` of them left out.

    count = floor(max(0, heard_ms) / ms_per_unit), at most the unit count; the result is the end of
    unit count - withhold (so trailing punctuation is not included), 0 when none is kept.
    """
    if not (math.isfinite(ms_per_unit) and ms_per_unit > 0):
        raise ValueError(f"ms_per_unit must be finite and > 0, got {ms_per_unit}")
    if math.isnan(heard_ms) or withhold < 0:
        raise ValueError(f"bad heard_ms {heard_ms} or withhold {withhold}")
    spans = units(original)
    ratio = max(0.0, heard_ms) / ms_per_unit
    count = len(spans) if ratio >= len(spans) else math.floor(ratio)  # also caps heard_ms = inf
    kept = count - withhold
    return spans[kept - 1].end if kept > 0 else 0


def asr_prefix(
    original: str,
    transcript: str,
    *,
    tail_guard_units: int = 1,
    max_edit_ratio: float = 0.2,
    max_units: int = 512,
) -> int | None:
    """End offset of the original prefix an ASR transcript confirms, or None when the evidence is weak.

    All heard units are aligned (edit distance) to an anchored prefix of the original: its suffix is
    free, its leading units cannot be skipped. Refused: fewer than 3 heard units, more than
    `max_units`, more than floor(m * max_edit_ratio) edits, a tied endpoint or path, an edit touching
    a negation or a number, two deletions in a row, and fewer than tail_guard_units + 2 exact matches
    at the end. The last `tail_guard_units` heard units are withheld: ASR completes half-cut words.
    """
    if not 0 <= max_edit_ratio < 1 or tail_guard_units < 1 or max_units < 1:
        raise ValueError("invalid asr_prefix limits")
    source, heard = units(original), units(transcript)
    m = len(heard)
    if m < 3 or not source or max(len(source), m) > max_units:
        return None
    costs = _edit_costs([u.norm for u in heard], [u.norm for u in source])
    best = min(costs[m][1:])
    ends = [j for j, cost in enumerate(costs[m]) if j and cost == best]
    if best > math.floor(m * max_edit_ratio) or len(ends) != 1:
        return None
    matches = _backtrace(costs, heard, source, ends[0], tail_guard_units + 2)
    if matches is None:
        return None
    return max((source[j].end for i, j in matches if i < m - tail_guard_units), default=0)


def _normalize(unit: str) -> str:
    return unicodedata.normalize("NFKC", unit).casefold().replace("’", "'")


def _protected(norm: str) -> bool:
    return norm in _NEGATIONS or any(c.isdigit() for c in norm)


def _edit_costs(heard: list[str], source: list[str]) -> list[list[int]]:
    """costs[i][j]: edits aligning heard[:i] to source[:j]; skipping source's first units is forbidden."""
    m, n = len(heard), len(source)
    inf = n + m + 1  # larger than any real cost
    costs = [[0] + [inf] * n] + [[i] + [0] * n for i in range(1, m + 1)]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            costs[i][j] = min(
                costs[i - 1][j - 1] + (heard[i - 1] != source[j - 1]),  # match / replace
                costs[i - 1][j] + 1,  # insert (a heard unit not in the original)
                costs[i][j - 1] + 1,  # delete (an original unit not heard)
            )
    return costs


def _backtrace(
    costs: list[list[int]], heard: list[Unit], source: list[Unit], end: int, tail: int
) -> list[tuple[int, int]] | None:
    """The (heard, source) index pairs that match exactly on the one best path ending at source[:end],
    or None when the path is tied, edits a protected unit, deletes twice in a row, or its last
    `tail` steps are not all exact matches."""
    i, j = len(heard), end
    matches: list[tuple[int, int]] = []
    in_tail, tail_matches, deleted = True, 0, 0
    while i or j:
        ops = _steps(costs, heard, source, i, j)
        if len(ops) != 1:
            return None  # a tied path is ambiguous even with a unique endpoint
        op = ops[0]
        if op == "match":
            matches.append((i - 1, j - 1))
            tail_matches += in_tail
            deleted = 0
        else:
            in_tail = False
            if op in ("delete", "replace") and _protected(source[j - 1].norm):
                return None
            if op in ("insert", "replace") and _protected(heard[i - 1].norm):
                return None
            deleted = deleted + 1 if op == "delete" else 0
            if deleted > 1:
                return None
        i -= op != "delete"
        j -= op != "insert"
    return matches if tail_matches >= tail else None


def _steps(costs: list[list[int]], heard: list[Unit], source: list[Unit], i: int, j: int) -> list[str]:
    """Every last step an optimal alignment of heard[:i] to source[:j] can take."""
    ops = []
    if i and j:
        equal = heard[i - 1].norm == source[j - 1].norm
        if costs[i][j] == costs[i - 1][j - 1] + (not equal):
            ops.append("match" if equal else "replace")
    if i and costs[i][j] == costs[i - 1][j] + 1:
        ops.append("insert")
    if j and costs[i][j] == costs[i][j - 1] + 1:
        ops.append("delete")
    return ops
