"""What of an LLM's text is spoken: not its reasoning (`<think>...</think>`), and not its markdown.

`LlmText` reads text in pieces cut anywhere and speaks exactly what `filter_llm_text` speaks of the
whole text: it decides a character only once no later text can change the decision, and holds back
the rest (a `*` until the character after it, `<thi` until the tag is whole or cannot be, a link's
`](` until its `)`). So a streamed reply reads the same tokens as its whole text (the daemon's
streaming contract). What is dropped, and what is kept (docs/streaming.md states it for users):

- `<think>` to `</think>` (to the end when it is never closed), a lone `</think>`, `<!--` to `-->`;
- at a line's start: indentation; `#` to `######` before a space (headings); `>` (block quotes);
  `-`, `*`, `+` before a space (bullets); `1.` or `1)` before a space (numbered items); `[ ]`, `[x]`
  (task boxes); a leading `|`; a line of only `-`, `*`, `_`, `=`, `|`, `:` and blanks with at least
  one of `-*_=` (rules, table rules, setext underlines), with its line break;
- a code fence (three or more backticks or tildes at a line's start) with everything up to its
  closing fence (to the end when it is never closed);
- backticks (a code span's text is kept as written, up to its closing run or the line's end);
- runs of `*` and `_` (emphasis), except between blanks (`2 * 3`), `*` between digits (`2*3`) and `_`
  inside a word (`snake_case`); runs of two or more `~`;
- `[` and `]`, and a link's `(target)` right after its `]`: `[text](url)` is "text"; an image
  `![alt](url)` entirely; HTML tags (`<b>`, `</div>`, `<br/>`, `<a href=...>`); a special token's
  spelling (`<|im_end|>`: letters, digits and `_` between `<|` and `|>`);
- a `|` at a line's end with the blanks before it; another `|` with the blanks around it becomes ", ";
- `\\` before ASCII punctuation (the punctuation is kept as text);
- blanks before the first spoken character.

A target or tag is one line of at most `MAX_SPAN` characters; anything else is kept as text.
"""

from __future__ import annotations

import re
import string

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
COMMENT_OPEN, COMMENT_CLOSE = "<!--", "-->"
MAX_SPAN = 512
"""Longest link target, image or HTML tag, in characters: a longer one is text (the wait it costs is bounded)."""

TEXT, THINK, FENCE, CODE = "text", "think", "fence", "code"
BLANK = frozenset(" \t")
EOL = frozenset(("\n", ""))
"""A line's end: a line break, or the end of the text ("")."""
RULE = frozenset("-*_=|:") | BLANK
RULE_MARKS = frozenset("-*_=")
PUNCTUATION = frozenset(string.punctuation)
LETTERS = frozenset(string.ascii_letters)
TAG_NAME = LETTERS | frozenset(string.digits + "-")
SPECIAL_NAME = LETTERS | frozenset(string.digits + "_")
PLAIN = re.compile(r"[^\n \t|\\`*_~\[\]!<]+")
"""A run of characters that are always text (every other character has a rule above)."""


class _More(Exception):
    """The decision needs text that has not come yet."""


class LlmText:
    """The spoken part of a text that arrives in pieces: `feed` each piece, then `end` once; each
    returns the text that became certain. Used by one thread at a time."""

    def __init__(self) -> None:
        self._held = ""
        """Text received and not yet decided."""
        self._ended = False
        self._mode = TEXT
        self._close = ""
        """What ends the mode: the closing tag (think, comment), the opening run (fence, code span)."""
        self._line_start = True
        self._prev = "\n"
        """The last character read in text mode (emphasis needs what is on either side of a run)."""
        self._spoken = False

    def feed(self, piece: str) -> str:
        if self._ended:
            raise ValueError("the text has already ended")
        self._held += piece
        return self._run()

    def end(self) -> str:
        """The rest: nothing is held back once the text has ended."""
        if self._ended:
            raise ValueError("the text has already ended")
        self._ended = True
        return self._run()

    def _run(self) -> str:
        s, i, out = self._held, 0, []
        while i < len(s):
            try:
                i, text = self._step(s, i)
            except _More:
                break
            out.append(text)
        self._held = s[i:]
        spoken = "".join(out)
        if not self._spoken:
            spoken = spoken.lstrip()
            self._spoken = bool(spoken)
        return spoken

    def _at(self, s: str, j: int) -> str:
        """The character at `j`; "" past the end of the text; _More past what has come so far."""
        if j < len(s):
            return s[j]
        if self._ended:
            return ""
        raise _More

    def _run_of(self, s: str, i: int, chars: frozenset[str] | str) -> int:
        """The end of the run of `chars` that starts at `i`."""
        while (c := self._at(s, i)) and c in chars:
            i += 1
        return i

    def _is(self, s: str, i: int, word: str) -> bool:
        return all(self._at(s, i + k) == c for k, c in enumerate(word))

    # Each step reads what it needs first (which may raise _More) and only then changes the state,
    # so a step that waits for more text has changed nothing. It returns (next index, spoken text).

    def _step(self, s: str, i: int) -> tuple[int, str]:
        if self._mode == THINK:
            return self._skip_to_close(s, i)
        if self._mode == FENCE:
            return self._fenced(s, i)
        if self._mode == CODE:
            return self._code(s, i)
        if self._line_start:
            end = self._line_marker(s, i)
            if end is not None:
                return end, ""
            self._line_start = False
        return self._inline(s, i)

    def _skip_to_close(self, s: str, i: int) -> tuple[int, str]:
        """Inside `<think>` or `<!--`: nothing is spoken up to the closing tag."""
        k = s.find(self._close, i)
        if k >= 0:
            self._mode = TEXT
            return k + len(self._close), ""
        if self._ended:
            return len(s), ""
        keep = next((n for n in range(min(len(self._close) - 1, len(s) - i), 0, -1)
                     if s.endswith(self._close[:n])), 0)  # the closing tag may be starting
        if len(s) - keep <= i:
            raise _More
        return len(s) - keep, ""

    def _fenced(self, s: str, i: int) -> tuple[int, str]:
        """Inside a code fence: nothing is spoken up to a line of the fence's character, at least as
        many, and blanks."""
        if self._line_start:
            j = self._run_of(s, i, BLANK)
            k = self._run_of(s, j, self._close[0])
            m = self._run_of(s, k, BLANK)
            if k - j >= len(self._close) and self._at(s, m) in EOL:
                self._mode = TEXT
                return m + (self._at(s, m) == "\n"), ""
            self._line_start = False
        k = s.find("\n", i)
        self._line_start = k >= 0
        return (k + 1 if k >= 0 else len(s)), ""

    def _code(self, s: str, i: int) -> tuple[int, str]:
        """Inside a code span: its text as written, up to a backtick run as long as the opening one."""
        c = s[i]
        if c == "\n":
            self._mode, self._line_start, self._prev = TEXT, True, c
            return i + 1, c
        if c == "`":
            j = self._run_of(s, i, "`")
            if j - i == len(self._close):
                self._mode, self._prev = TEXT, c
                return j, ""
            return j, s[i:j]
        j = i + 1
        while j < len(s) and s[j] not in "`\n":
            j += 1
        return j, s[i:j]

    def _line_marker(self, s: str, i: int) -> int | None:
        """At a line's start: the end of the block marker there (never spoken), or None."""
        c = s[i]
        if c in BLANK:
            return self._run_of(s, i, BLANK)
        if c in "`~":
            j = self._run_of(s, i, c)
            if j - i >= 3:
                self._mode, self._close, self._line_start = FENCE, s[i:j], False
                return j
        if c in RULE:
            j, marks = i, 0
            while (d := self._at(s, j)) and d in RULE:
                marks += d in RULE_MARKS
                j += 1
            if marks and d in EOL:
                return j + (d == "\n")
        if c == "#":
            j = self._run_of(s, i, "#")
            if j - i <= 6 and (self._at(s, j) in BLANK or self._at(s, j) in EOL):
                end = self._run_of(s, j, BLANK)
                self._line_start = False
                return end
        if c == ">":
            return i + 1 + (self._at(s, i + 1) == " ")
        if c in "-*+" and self._at(s, i + 1) in BLANK:
            return i + 2
        if c in string.digits:
            j = self._run_of(s, i, string.digits)
            if j - i <= 9 and self._at(s, j) in ".)" and self._at(s, j) and self._at(s, j + 1) in BLANK:
                return j + 2
        if c == "[" and self._at(s, i + 1) in " xX" and self._at(s, i + 1) and self._at(s, i + 2) == "]" \
                and self._at(s, i + 3) in BLANK:
            return i + 4
        if c == "|":
            end = self._run_of(s, i + 1, BLANK)
            self._line_start = False
            return end
        return None

    def _inline(self, s: str, i: int) -> tuple[int, str]:
        c = s[i]
        if plain := PLAIN.match(s, i):
            self._prev = s[plain.end() - 1]
            return plain.end(), plain.group()
        if c == "\n":
            self._line_start, self._prev = True, c
            return i + 1, c
        if c in BLANK:
            j = self._run_of(s, i, BLANK)
            before_pipe = self._at(s, j) == "|"
            self._prev = c
            return j, "" if before_pipe else s[i:j]
        if c == "|":
            j = self._run_of(s, i + 1, BLANK)
            cell = self._at(s, j) not in EOL  # a cell follows on this line
            self._prev = c
            return j, ", " if cell else ""
        if c == "\\":
            d = self._at(s, i + 1)
            if d in PUNCTUATION:
                self._prev = d
                return i + 2, d
            self._prev = c
            return i + 1, c
        if c == "`":
            j = self._run_of(s, i, "`")
            self._mode, self._close, self._prev = CODE, s[i:j], c
            return j, ""
        if c in "*_":
            return self._emphasis(s, i)
        if c == "~":
            j = self._run_of(s, i, "~")
            self._prev = c
            return j, "" if j - i >= 2 else c
        if c == "]" and self._at(s, i + 1) == "(" and (end := self._target(s, i + 2)) is not None:
            self._prev = ")"
            return end, ""
        if c in "[]":
            self._prev = c
            return i + 1, ""
        if c == "!" and (end := self._image(s, i)) is not None:
            self._prev = ")"
            return end, ""
        if c == "<":
            return self._angle(s, i)
        assert c == "!", c
        self._prev = c
        return i + 1, c

    def _emphasis(self, s: str, i: int) -> tuple[int, str]:
        """A run of `*` or `_`: markup, unless it stands between blanks, or (`*`) between digits, or
        (`_`) inside a word."""
        c = s[i]
        j = self._run_of(s, i, c)
        before, after = self._prev, self._at(s, j)
        between_blanks = (before in BLANK or before in EOL) and (after in BLANK or after in EOL)
        inside = (before.isdigit() and after.isdigit()) if c == "*" else (before.isalnum() and after.isalnum())
        self._prev = c
        return j, s[i:j] if between_blanks or inside else ""

    def _target(self, s: str, j: int) -> int | None:
        """The end of a link target whose `(` was just before `j`: its `)`, parentheses balanced, on one
        line within MAX_SPAN characters; None when there is none."""
        depth = 1
        for k in range(j, j + MAX_SPAN):
            d = self._at(s, k)
            if d in EOL:
                return None
            depth += (d == "(") - (d == ")")
            if depth == 0:
                return k + 1
        return None

    def _image(self, s: str, i: int) -> int | None:
        """The end of an image `![alt](target)` that starts at `i`, or None."""
        if self._at(s, i + 1) != "[":
            return None
        for k in range(i + 2, i + MAX_SPAN):
            d = self._at(s, k)
            if d in EOL:
                return None
            if d == "]":
                return self._target(s, k + 2) if self._at(s, k + 1) == "(" else None
        return None

    def _angle(self, s: str, i: int) -> tuple[int, str]:
        """`<`: a think block, a comment, an HTML tag, or text."""
        for tag, close in ((THINK_OPEN, THINK_CLOSE), (COMMENT_OPEN, COMMENT_CLOSE)):
            if self._is(s, i, tag):
                self._mode, self._close = THINK, close
                return i + len(tag), ""
        if self._is(s, i, THINK_CLOSE):
            return i + len(THINK_CLOSE), ""
        end = self._tag(s, i) if self._at(s, i + 1) != "|" else self._special(s, i)
        self._prev = ">" if end is not None else "<"
        return (end, "") if end is not None else (i + 1, "<")

    def _special(self, s: str, i: int) -> int | None:
        """The end of a special token's spelling that starts at `i` (`<|im_end|>`), or None."""
        k = self._run_of(s, i + 2, SPECIAL_NAME)
        return k + 2 if k > i + 2 and self._is(s, k, "|>") else None

    def _tag(self, s: str, i: int) -> int | None:
        """The end of an HTML tag that starts at `i` (`<name ...>`, `</name>`, `<name/>`), or None."""
        k = i + 1 + (self._at(s, i + 1) == "/")
        if self._at(s, k) not in LETTERS:
            return None
        k = self._run_of(s, k, TAG_NAME)
        if self._at(s, k) == ">":
            return k + 1
        if self._at(s, k) == "/":
            return k + 2 if self._at(s, k + 1) == ">" else None
        if self._at(s, k) not in BLANK:
            return None
        for m in range(k, i + MAX_SPAN):
            d = self._at(s, m)
            if d == ">":
                return m + 1
            if d in EOL or d == "<":
                return None
        return None


def filter_llm_text(text: str) -> str:
    """The spoken part of a whole text (what `LlmText` speaks of it in any pieces)."""
    f = LlmText()
    return f.feed(text) + f.end()
