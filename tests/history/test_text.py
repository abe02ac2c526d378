"""Heard-text arithmetic: units, the ASR prefix and the rate prefix, as slices of the original text.

The `asr_prefix` cases are vllm-omni's (heard-text notes §3.2); each refusal names the rule that
refuses it in the reference code.
"""

from __future__ import annotations

import math

import pytest

from edged.history.text import asr_prefix, rate_prefix, unit_count, units, word_cut


def heard(original: str, transcript: str, **kwargs) -> str | None:
    offset = asr_prefix(original, transcript, **kwargs)
    return None if offset is None else original[:offset]


def test_units_normalize_each_unit_and_keep_original_offsets():
    text = "今天用ＡＩ，Don't stop！"
    got = units(text)
    assert [u.norm for u in got] == ["今", "天", "用", "ai", "don't", "stop"]
    assert [text[u.start : u.end] for u in got] == ["今", "天", "用", "ＡＩ", "Don't", "stop"]


def test_units_split_cjk_from_words_and_straighten_apostrophes():
    assert [u.norm for u in units("用AI写code")] == ["用", "ai", "写", "code"]
    assert [u.norm for u in units("I don’t_know 42x")] == ["i", "don't", "know", "42x"]
    assert units("，。！ - _") == []
    assert unit_count("Hello, world. 你好") == 4


@pytest.mark.parametrize(
    "original, transcript, expected",
    [
        ("你好，今天我们介绍三个方法。", "你好今天我们介绍", "你好，今天我们介"),
        ("Hello, we will explain three options today.", "hello we will explain three", "Hello, we will explain"),
        ("今天下午开会请提前到场。", "今天下午开慧请提前到", "今天下午开会请提前"),  # 1 substitution tolerated
        ("Hello world again. The rest is unheard.", "Hello world again", "Hello world"),
        ("今天用ＡＩ写代码。", "今天用ai写", "今天用ＡＩ"),  # matched after NFKC + casefold
        ("Please just stop the server now.", "please stop the server now", "Please just stop the server"),
        ("There are few files in the folder.", "there are view files in the folder", "There are few files in the"),
    ],
)
def test_asr_prefix_accepts(original, transcript, expected):
    assert heard(original, transcript) == expected


@pytest.mark.parametrize(
    "original, transcript",
    [
        ("不要关闭服务然后重启机器。", "关闭服务然后重启"),  # leading deletions forbidden: 3 edits > 1
        ("Please do not stop the server now.", "please do stop the server now"),  # negation deleted
        ("Please stop the server now.", "please not stop the server now"),  # negation inserted
        ("There are 15 files in the folder.", "there are 50 files in the folder"),  # digit replaced
        ("我们明天一起去公园散步。", "我们"),  # fewer than 3 heard units
        ("Go left then go left then stop.", "go left go left"),  # 1 edit > floor(4 * 0.2) = 0
        ("Hello world.", "thanks for watching this video"),  # hallucination: 5 edits
        ("One two three four five five.", "one two three four five six"),  # tied endpoint
        ("Well, hello hello world, how are you?", "well hello world how are you"),  # tied path
        (
            "One two three four five six seven eight nine ten eleven twelve.",
            "one two three six seven eight nine ten eleven twelve",
        ),  # two deletions in a row
        ("One two three four five six seven.", "one two three four five sux seven"),  # 1 exact match at the end
        ("", "one two three"),  # no source units
    ],
)
def test_asr_prefix_refuses(original, transcript):
    assert asr_prefix(original, transcript) is None


def test_asr_prefix_tail_guard_withholds_more_and_needs_a_longer_exact_tail():
    original = "Hello world again. The rest is unheard."
    assert heard(original, "hello world again the", tail_guard_units=2) == "Hello world"
    assert heard(original, "hello world again", tail_guard_units=2) is None  # 3 exact matches < 2 + 2


def test_asr_prefix_refuses_over_max_units_and_bad_limits():
    words = " ".join(f"w{chr(97 + i % 26)}" for i in range(20))
    assert heard(words, "wa wb wc wd", max_units=19) is None  # the original alone is too long
    assert heard(words, "wa wb wc wd", max_units=20) == "wa wb wc"
    with pytest.raises(ValueError):
        asr_prefix(words, "wa wb wc", tail_guard_units=0)
    with pytest.raises(ValueError):
        asr_prefix(words, "wa wb wc", max_edit_ratio=1.0)


TEXT = "Hello world again. The rest."


@pytest.mark.parametrize(
    "heard_ms, withhold, expected",
    [
        (600, 1, "Hello"),  # count 2
        (1000, 1, "Hello world again"),  # count 4; punctuation after the last unit is not included
        (999, 1, "Hello world"),
        (0, 1, ""),
        (-50, 1, ""),
        (300, 1, ""),  # count 1, withheld
        (1e12, 1, "Hello world again. The"),
        (math.inf, 1, "Hello world again. The"),
        (600, 0, "Hello world"),
        (1e12, 0, TEXT[:-1]),
        (1000, 2, "Hello world"),
    ],
)
def test_rate_prefix(heard_ms, withhold, expected):
    assert TEXT[: rate_prefix(TEXT, heard_ms, 250.0, withhold=withhold)] == expected


def test_rate_prefix_counts_cjk_per_character():
    text = "今天很好。"
    assert text[: rate_prefix(text, 760, 250.0)] == "今天"
    assert text[: rate_prefix(text, 1e9, 250.0)] == "今天很"
    assert rate_prefix("", 1e9, 250.0) == 0


def test_rate_prefix_huge_heard_ms_keeps_all_but_the_last_unit():
    text = "Hello world again."
    assert text[: rate_prefix(text, 1e15, 250.0)] == "Hello world"


@pytest.mark.parametrize(
    "ms_per_unit, heard_ms, withhold",
    [(0.0, 1.0, 1), (math.nan, 1.0, 1), (math.inf, 1.0, 1), (250.0, math.nan, 1), (250.0, 1.0, -1)],
)
def test_rate_prefix_rejects_bad_arguments(ms_per_unit, heard_ms, withhold):
    with pytest.raises(ValueError):
        rate_prefix(TEXT, heard_ms, ms_per_unit, withhold=withhold)


@pytest.mark.parametrize(
    "text, offset, expected",
    [
        ("Hello, world again", 3, ""),
        ("Hello, world again", 5, "Hello"),
        ("Hello, world again", 7, "Hello"),
        ("Hello, world again", 10, "Hello"),
        ("Hello, world again", 12, "Hello, world"),
        ("Hello, world again", 18, "Hello, world again"),
        ("I don't know.", 4, "I"),  # never splits "don't"
        ("I don't know.", 13, "I don't know"),
        ("今天很好", 2, "今天"),
        ("", 0, ""),
    ],
)
def test_word_cut(text, offset, expected):
    assert text[: word_cut(text, offset)] == expected


def test_word_cut_rejects_offsets_outside_the_text():
    with pytest.raises(ValueError):
        word_cut("abc", 4)
    with pytest.raises(ValueError):
        word_cut("abc", -1)
