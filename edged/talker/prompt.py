"""A talker prompt: the prefill rows and the text track, as row blocks a family's layout decides.

Every prompt row is a sum of parts: rows looked up by id in a host table (the projected text table,
the codec embedding), rows given as vectors (a cloned voice's x-vector), or vectors of another width
projected into talker rows when the prompt is written (a thinker's hidden states). A `Block` is a
run of consecutive rows whose parts all have its length. The prefill is fed at once; the text track
is read one row per frame after it, and once it is used up the family's pad row follows. Layouts
(`edged.talker.layouts`) build prompts; `write` lays them into the stage's preallocated buffers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


class PromptError(ValueError):
    """A request whose prompt cannot be built; the message names the field."""


def frame_room(max_seq: int, prefill_rows: int) -> int:
    """The most frames a reply whose prefill has `prefill_rows` rows makes in a KV cache of `max_seq`
    rows: the prefill makes the first, and each later frame's input takes one row."""
    return max_seq - prefill_rows + 1


@dataclass(frozen=True)
class Lookup:
    """Rows of a host table, by id; of table[index] when the table is a stack (the code
    predictor's codec embeddings, one per residual group)."""

    table: str
    ids: tuple[int, ...]
    index: int | None = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class Given:
    """Rows given as vectors, [n, H]."""

    rows: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, eq=False)
class Projected:
    """Vectors [n, W] that `project` turns into talker rows [n, H] when the prompt is written, so
    admission plans a prompt without paying for them."""

    rows: np.ndarray
    project: Callable[[np.ndarray], np.ndarray]

    def __len__(self) -> int:
        return int(self.rows.shape[0])


Part = Lookup | Given | Projected


@dataclass(frozen=True)
class Block:
    """Consecutive rows, each the sum of the parts' rows at its index."""

    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        lengths = {len(p) for p in self.parts}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"a prompt block needs parts of one non-zero length, got {sorted(lengths)}")

    def __len__(self) -> int:
        return len(self.parts[0])


@dataclass(frozen=True)
class Prompt:
    prefill: tuple[Block, ...]
    track: tuple[Block, ...] = ()
    """Text-track rows, one per frame after the prefill (the dual-track layout)."""
    text_tokens: int = 0
    """Text tokens of the request, for reports."""
    dual_track: bool = False
    """The dual-track layout (its track may be empty: a short text beside a cloned voice's reference
    frames is all in the prefill)."""

    @property
    def prefill_len(self) -> int:
        return sum(len(b) for b in self.prefill)

    @property
    def track_len(self) -> int:
        return sum(len(b) for b in self.track)

    def write(self, tables: Mapping[str, np.ndarray], rows: np.ndarray, track: np.ndarray) -> None:
        """rows[:prefill_len] and track[:min(track_len, len(track))] (preallocated buffers) = this
        prompt; track rows beyond the buffer are left out."""
        _write(self.prefill, tables, rows)
        _write(self.track, tables, track)


def _write(blocks: tuple[Block, ...], tables: Mapping[str, np.ndarray], out: np.ndarray) -> None:
    n = 0
    for block in blocks:
        rows = out[n:n + len(block)]
        if not len(rows):
            return
        for i, part in enumerate(block.parts):
            if isinstance(part, Lookup):
                table = tables[part.table] if part.index is None else tables[part.table][part.index]
                source = table[list(part.ids[:len(rows)])]
            elif isinstance(part, Projected):
                source = part.project(part.rows[:len(rows)])
            else:
                source = part.rows[:len(rows)]
            if source.shape[1:] != rows.shape[1:]:
                raise PromptError(f"prompt rows have width {source.shape[1:]}, the talker takes {rows.shape[1:]}")
            if i == 0:
                rows[...] = source
            else:
                rows += source
        n += len(block)
