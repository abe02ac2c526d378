"""The LLM text filter (edged/llm_text.py): what of each construct is spoken, and that pieces cut
anywhere speak exactly what the whole text speaks (the daemon's streaming contract)."""

from __future__ import annotations

import random

import pytest

from edged.llm_text import MAX_SPAN, LlmText, filter_llm_text

URL = "https://www.example.com/search?q=" + "mars+surface+temperature+" * 11 + "&hl=en"
"""A link target of real length (314 characters), as LLMs write search and citation links."""
TAG = '<a href="' + URL + '" title="' + "Mars facts " * 9 + '">'
"""An HTML tag of 433 characters."""
IMAGE = "![chart](https://img.example.org/" + "charts/mars/" * 36 + "temp.png)"
"""An image of 474 characters."""
SPAN = 512
"""The longest target, image or tag dropped, pinned as a number (edged/llm_text.py MAX_SPAN)."""

CASES = [
    # reasoning
    ("<think>plan it</think>The answer.", "The answer."),
    ("<think>\nplan *it*\n</think>\n\nThe answer.", "The answer."),
    ("<think></think>Short.", "Short."),
    ("Yes.<think>never closed, never spoken", "Yes."),
    ("plan it</think>The answer.", "plan itThe answer."),  # a lone closing tag: only the tag goes
    ("A <thinking> tag is HTML.", "A  tag is HTML."),
    # headings, quotes, lists, rules, tables
    ("# Title\n## Sub\n###### Six\n####### seven\n#hashtag", "Title\nSub\nSix\n####### seven\n#hashtag"),
    ("> quoted\n> > nested\n>no space", "quoted\nnested\nno space"),
    ("- one\n* two\n+ three\n  - indented\n-5 degrees", "one\ntwo\nthree\nindented\n-5 degrees"),
    ("1. one\n2) two\n10. ten\n3.14 is pi\n2024 was", "one\ntwo\nten\n3.14 is pi\n2024 was"),
    ("- [ ] todo\n- [x] done\n- [X] too", "todo\ndone\ntoo"),
    ("Above\n---\nBelow\n===\n***\n- - -\n___\nEnd", "Above\nBelow\nEnd"),
    ("| Planet | Temp |\n|---|:---:|\n| Mars | -60 |\n", "Planet, Temp\nMars, -60\n"),
    ("a|b | c", "a, b, c"),
    # emphasis
    ("**bold** and *it* and ***both*** and __u__ and _i_", "bold and it and both and u and i"),
    ("Note:** x**y", "Note: xy"),
    ("2 * 3 = 6, 2*3, snake_case_name, a * b", "2 * 3 = 6, 2*3, snake_case_name, a * b"),
    ("~~gone~~ ~5 min", "gone ~5 min"),
    ("中文**强调**中文。", "中文强调中文。"),
    # code
    ("Use `ls -l` here", "Use ls -l here"),
    ("``a ` b`` c", "a ` b c"),
    ("`open *span\n**x**", "open *span\nx"),  # a code span ends with its line
    ("Run:\n```bash\nrm -rf /\n```\nDone.", "Run:\nDone."),
    ("~~~\ncode\n~~~~\nafter", "after"),
    ("````\n```\nstill code\n````\nafter", "after"),
    ("Code:\n```\nnever closed\nstill code", "Code:\n"),
    # links, images, tags
    ("See [the docs](https://x.org/a_(b)) now.", "See the docs now."),
    ("An image ![a cat](cat.png) here.", "An image  here."),
    ("[1] and [text] alone; [open](no close", "1 and text alone; open(no close"),
    ("![alt] no target! Yes!", "!alt no target! Yes!"),
    ('a <b>bold</b> <br/> <a href="x">link</a>', "a bold  link"),
    ("x < y, <3, a<b", "x < y, <3, a<b"),
    ("<!-- hidden\ncomment -->shown", "shown"),
    ("Read [the report](" + URL + ") first.", "Read the report first."),  # real lengths, 100-500 characters
    (TAG + "link</a> here.", "link here."),
    ("See " + IMAGE + " below.", "See  below."),
    ("Done.<|im_end|> <|a b|>", "Done. <, a b, >"),  # a blank: not a special token
    # escapes, blanks
    ("\\*not emphasis\\* \\_x\\_ \\n", "*not emphasis* _x_ \\n"),
    ("  \n\n  Hello", "Hello"),
    ("", ""),
]

EXAMPLE = ("<think>\nThe user asks about Mars. Use *markdown*? `no`.\n</think>\n\n# Mars\n\n**Mars** is *cold* "
           "and _dry_.\n\n- It has `thin` air.\n- See [NASA](https://nasa.gov/mars_(planet)) and ![a photo](img.png)."
           "\n1. First\n2) Second\n> quoted <b>bold</b> text\n\n| Planet | Temp |\n|---|:---:|\n| Mars | -60 |\n\n"
           "```python\nprint('hi')\n```\nDone: 2 * 3 = 6, snake_case, ~~old~~ ~5, \\*lit\\*, a < b, <!-- note -->end.\n"
           "---\n- [x] task\n<think>unclosed")


def pieces_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def streamed(pieces: list[str]) -> str:
    f = LlmText()
    return "".join(f.feed(p) for p in pieces) + f.end()


@pytest.mark.parametrize(("text", "spoken"), CASES)
def test_each_construct(text, spoken):
    assert filter_llm_text(text) == spoken


@pytest.mark.parametrize(("text", "spoken"), [*CASES, (EXAMPLE, None)])
def test_pieces_cut_anywhere_speak_the_whole_texts_words(text, spoken):
    whole = filter_llm_text(text)
    assert spoken is None or whole == spoken
    for i in range(len(text) + 1):
        assert streamed(pieces_at(text, [i])) == whole, f"cut at {i}: {text[:i]!r} | {text[i:]!r}"
    assert streamed(list(text)) == whole
    rng = random.Random(7)
    for _ in range(100):
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(2, 8)))
        assert streamed(pieces_at(text, cuts)) == whole, cuts


def test_the_example_keeps_only_the_spoken_answer():
    assert filter_llm_text(EXAMPLE) == ("Mars\n\nMars is cold and dry.\n\nIt has thin air.\nSee NASA and .\nFirst\n"
                                        "Second\nquoted bold text\n\nPlanet, Temp\nMars, -60\n\nDone: 2 * 3 = 6, "
                                        "snake_case, old ~5, *lit*, a < b, end.\ntask\n")


def test_what_later_text_could_change_is_held_back_and_only_that():
    f = LlmText()
    assert f.feed("Plain words") == "Plain words"
    assert f.feed(" and **") == " and "  # the run's next character decides
    assert f.feed("x") == "x"
    assert f.feed("** <thi") == " "  # `<thi` may still become <think>
    assert f.feed("nk>reasoning</thi") == ""
    assert f.feed("nk> done. [link") == " done. link"
    assert f.feed("](http://a.b") == ""  # the target, until its `)`
    assert f.feed(") ok") == " ok"
    assert f.end() == ""


def test_a_line_start_waits_only_for_its_marker():
    f = LlmText()
    assert f.feed("Intro\n") == "Intro\n"
    assert f.feed("- ") == ""  # a bullet, or the start of a rule "- - -"
    assert f.feed("item\n12") == "item\n"  # `12` may be a numbered item's
    assert f.feed(". twelve") == "twelve"
    assert f.end() == ""


def test_a_target_or_tag_longer_than_the_span_is_text():
    assert MAX_SPAN == SPAN
    long = "x" * SPAN
    assert filter_llm_text(f"[a](http://{long})") == f"a(http://{long})"
    assert filter_llm_text(f'<a href="{long}">b</a>') == f'<a href="{long}">b'


def test_nothing_after_the_end():
    f = LlmText()
    f.feed("a")
    f.end()
    with pytest.raises(ValueError, match="already ended"):
        f.feed("b")
    with pytest.raises(ValueError, match="already ended"):
        f.end()
