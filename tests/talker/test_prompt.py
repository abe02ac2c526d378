"""Prompts as row blocks: table lookups and rows given as vectors, summed row by row."""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.talker.prompt import Block, Given, Lookup, Prompt, PromptError

TABLES = {"a": np.arange(20, dtype=np.float32).reshape(10, 2), "b": 100 + np.arange(20, dtype=np.float32).reshape(10, 2)}


def test_blocks_write_sums_of_lookups_and_given_rows():
    given = np.array([[0.5, 0.25], [1.0, 2.0]], np.float32)
    prompt = Prompt(prefill=(Block((Lookup("a", (1, 2)), Lookup("b", (3, 3)))), Block((Given(given), Lookup("a", (0, 9))))),
                    track=(Block((Lookup("b", (7,)),)),), text_tokens=2)
    rows, track = np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)
    prompt.write(TABLES, rows, track)
    assert prompt.prefill_len == 4 and prompt.track_len == 1
    want = np.stack([TABLES["a"][1] + TABLES["b"][3], TABLES["a"][2] + TABLES["b"][3],
                     given[0] + TABLES["a"][0], given[1] + TABLES["a"][9]])
    assert np.array_equal(rows[:4], want) and np.array_equal(track[0], TABLES["b"][7])


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="one non-zero length"):
        Block((Lookup("a", (1, 2)), Lookup("b", (3,))))
    with pytest.raises(PromptError, match="width"):
        Prompt((Block((Given(np.zeros((1, 3), np.float32)),)),)).write(TABLES, np.zeros((4, 2), np.float32),
                                                                       np.zeros((4, 2), np.float32))


def test_rows_given_as_vectors_speak_like_their_lookups(builtin_artifact, backend):
    """The codec rows of a voice's prompt given as vectors (as a cloned voice's x-vector will be)
    make exactly the frames of the same rows looked up by id."""
    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    layout, tables = core.talker.layout, core.talker.tables

    def as_vectors(prompt: Prompt) -> Prompt:
        def block(b: Block) -> Block:
            return Block(tuple(Given(tables[p.table][list(p.ids)]) if isinstance(p, Lookup) and p.table == "codec_embedding"
                               else p for p in b.parts))
        return Prompt(tuple(block(b) for b in prompt.prefill), prompt.track, prompt.text_tokens)

    request = SpeechRequest("v", "A voice given as vectors.", voice="ryan", language="english",
                            sampling=Sampling.greedy(), max_frames=30)
    frames = []
    for plan in (layout.plan, lambda r, streamed=None: as_vectors(layout.plan(r, streamed))):
        core.talker.layout = type("Layout", (), {"plan": staticmethod(plan)})()
        member = core.prepare(request, 0)
        while member.outcome.value == "running":
            core.step([member])
        frames.append(core.frames(member).copy())
    core.talker.layout = layout
    assert any(isinstance(p, Given) for b in as_vectors(layout.plan(request)).prefill for p in b.parts)
    assert frames[0].shape == (30, core.artifact.dims.code_groups) and np.array_equal(frames[0], frames[1])
