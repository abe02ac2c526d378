"""The text tokenizer of an artifact (`tokenizer.json`, loaded by the `tokenizers` library), and the
incremental tokenization of text that arrives in pieces.

A piece can end anywhere: inside a word ("Hel" + "lo"), inside a BPE merge, or inside a special
token's spelling ("<|im_" + "end|>"). The talker must read exactly the ids of the whole text, so a
`TextStream` commits only ids that no further text can change: the tokens of every pre-token (the
tokenizer's word split) except the last one, and never the start of what could still become a
special token. Appending text can only change the last pre-token of a text (the Qwen2 split regex
has no lookbehind, and a pre-token ends where the next match starts), and BPE merges never cross
pre-tokens. On `final` the rest is committed. Earlier pre-tokens are fixed, so each piece
re-tokenizes only the text from the first uncommitted pre-token on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True)
class Streamed:
    """A streamed text as far as it is certain: the template's head ids as tokenized with the text,
    the text's committed ids, and whether the text has ended."""

    head: tuple[int, ...]
    ids: tuple[int, ...]
    final: bool


class TextEncoder:
    def __init__(self, path: Path):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.special = tuple(t.content for t in self.tokenizer.get_added_tokens_decoder().values())

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


class TextStream:
    """The ids of a text received in pieces, after a fixed `prefix` (the layout's text before the
    reply's text) whose first `prefix_ids` ids are not the reply's. Used by one thread at a time."""

    def __init__(self, encoder: TextEncoder, prefix: str, prefix_ids: int):
        self.encoder = encoder
        self.prefix, self.prefix_ids = prefix, prefix_ids
        self.text = ""
        """Everything received."""
        self.base = 0
        """Where the uncommitted text starts (a pre-token boundary)."""
        self.committed = 0
        """Ids committed so far."""
        self.head: tuple[int, ...] = ()
        """The prefix's ids as tokenized with the text (set with the first committed id)."""
        self.final = False

    def feed(self, piece: str, final: bool = False) -> list[int]:
        """Append `piece`; the ids that became certain (all the rest when `final`)."""
        if self.final:
            raise ValueError("the text stream has already ended")
        self.text += piece
        self.final = final
        head = self.prefix if not self.committed else ""  # the prefix, until the first id is certain
        tail = head + self.text[self.base:]
        enc = self.encoder.tokenizer.encode(tail, add_special_tokens=False)
        skip = self.prefix_ids if head else 0
        ids, words, offsets = enc.ids[skip:], enc.word_ids[skip:], enc.offsets[skip:]
        keep = len(ids) if final else self._certain(tail, words, offsets)
        if keep:
            self.head = self.head or tuple(enc.ids[:skip])
            self.base += (offsets[keep][0] if keep < len(ids) else len(tail)) - len(head)
            self.committed += keep
        return ids[:keep]

    def _certain(self, tail: str, words: list, offsets: list[tuple[int, int]]) -> int:
        """How many leading ids no further text can change: those before the last pre-token, and
        before the pre-token where a special token's spelling may be starting."""
        if not words:
            return 0
        hold = words[-1]
        cut = self._special_start(tail)
        at_cut = next((w for w, (_, end) in zip(words, offsets) if end > cut), None)
        if at_cut is not None:
            hold = min(hold, at_cut)
        return next(i for i, w in enumerate(words) if w >= hold)

    def _special_start(self, text: str) -> int:
        """Where a suffix of `text` could still grow into a special token (len(text) when none)."""
        start = len(text)
        for token in self.encoder.special:
            for k in range(min(len(token) - 1, len(text)), 0, -1):
                if text.endswith(token[:k]):
                    start = min(start, len(text) - k)
                    break
        return start
