"""The text tokenizer of an artifact (`tokenizer.json`, loaded by the `tokenizers` library)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TextEncoder:
    def __init__(self, path: Path):
        self.tokenizer = Tokenizer.from_file(str(path))

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids
