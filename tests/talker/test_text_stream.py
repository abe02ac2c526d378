"""Incremental tokenization (`TextStream`): pieces cut anywhere give exactly the ids of the whole
text, and nothing is committed that later text could change."""

from __future__ import annotations

import random

import pytest

from edged.artifact import BUILTIN
from edged.talker.layouts.tts import ASSISTANT, ROLE_ROWS, TAIL_TOKENS
from edged.talker.text import TextEncoder, TextStream

TEXTS = [
    "Hello world, it's 12 o'clock.  Really?! We'll see...",
    "你好，世界。今天天气很好！我们走吧。",
    "Café naïve résumé: e\u0301 is not é, but NFC makes it so.",
    "Wait<|im_end|> that was a special token, and <|im_sta is not.",
    "\n\nIt starts with line breaks\tand has\ttabs.",
    "Emoji 🙂 and 👍🏽 too, 1234567 digits, x<|im_en",
]


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder(BUILTIN / "tokenizer.json")


def whole(encoder: TextEncoder, text: str) -> list[int]:
    """What the tts layout reads for a text sent whole."""
    return encoder.ids(f"{ASSISTANT}{text}<|im_end|>\n{ASSISTANT}")[ROLE_ROWS:-TAIL_TOKENS]


def cuttings(text: str, rng: random.Random) -> list[list[str]]:
    cuts = [list(text), text.split(" ")]
    cuts[1] = [cuts[1][0]] + [" " + w for w in cuts[1][1:]]
    for _ in range(60):
        points = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        cuts.append([text[a:b] for a, b in zip([0, *points], [*points, len(text)])])
    return cuts


@pytest.mark.parametrize("text", TEXTS)
def test_committed_ids_are_always_a_prefix_of_the_whole_and_end_equal(encoder, text):
    rng = random.Random(text)
    want = whole(encoder, text)
    for pieces in cuttings(text, rng):
        stream = TextStream(encoder, ASSISTANT, ROLE_ROWS)
        got: list[int] = []
        for i, piece in enumerate(pieces):
            got += stream.feed(piece)
            so_far = whole(encoder, "".join(pieces[:i + 1]))
            assert got == want[:len(got)] == so_far[:len(got)], (pieces[:i + 1], got)
        got += stream.feed("", final=True)
        assert got == want, pieces
        assert stream.committed == len(want) and stream.text == text


def test_naive_per_piece_tokenization_would_read_other_ids(encoder):
    """Why the stream holds back: tokenizing each piece alone splits words and merges differently."""
    pieces = ["Hel", "lo wor", "ld, he", "re we g", "o."]
    naive = [i for p in pieces for i in encoder.ids(p)]
    want = whole(encoder, "".join(pieces))
    assert naive != want
    stream = TextStream(encoder, ASSISTANT, ROLE_ROWS)
    assert [i for p in pieces for i in stream.feed(p)] + stream.feed("", final=True) == want


def test_the_last_word_waits_for_the_next_piece(encoder):
    stream = TextStream(encoder, ASSISTANT, ROLE_ROWS)
    assert stream.feed("Hello") == []  # "Hellos" would tokenize otherwise
    hello = stream.feed(" world")
    assert hello == whole(encoder, "Hello") and stream.head == tuple(encoder.ids(ASSISTANT))
    assert stream.feed(", and") == whole(encoder, "Hello world,")[len(hello):]
    assert stream.feed("", final=True) == whole(encoder, "Hello world, and")[len(whole(encoder, "Hello world,")):]
    with pytest.raises(ValueError, match="already ended"):
        stream.feed("more")


def test_a_special_token_spelled_across_pieces_is_held_until_it_is_certain(encoder):
    stream = TextStream(encoder, ASSISTANT, ROLE_ROWS)
    got = stream.feed("Done. x<|im_") + stream.feed("end|> y")
    assert got == whole(encoder, "Done. x<|im_end|> y")[:len(got)]
    assert encoder.tokenizer.token_to_id("<|im_end|>") in got  # read as the special token, as whole text is
