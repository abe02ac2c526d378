"""Streamed text through the cohort loop (in process): whatever the cuts and the timing of the pieces,
a streamed reply makes exactly the greedy frames of the same text sent whole with the dual-track
layout, with other members running beside it; a member out of text waits and its waits are counted."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.loops import run_until_idle

from edged import protocol as wire
from edged.artifact import load_artifact
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.scheduler.commands import MoreText, Submit
from edged.scheduler.loop import CohortLoop
from edged.server.replies import ClientReplies
from edged.synth import Synthesizer

FRAMES = 60
TEXTS = {
    "english": "Well, here's the answer you asked for: it's 12 o'clock, and the café is still open.",
    "chinese": "你好，这是一个流式的回答。我们一边想，一边说！",
}
OTHERS = [SpeechRequest("o1", "Another member of the cohort, sent whole.", voice="vivian", max_frames=FRAMES),
          SpeechRequest("o2", "A third one, also whole, with the dual track.", dual_track=True, max_frames=FRAMES)]


def cuttings(text: str) -> dict[str, list[str]]:
    rng = random.Random(len(text))
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    words = text.split(" ")
    return {
        "whole": [text],
        "characters": list(text),
        "words": [words[0]] + [" " + w for w in words[1:]],  # as an LLM streams: a leading space
        "random cuts": [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])],
    }


@pytest.fixture(scope="module")
def reference(builtin_artifact, backend):
    """Greedy frames of each text sent whole with the dual-track layout (offline, the same core)."""
    synth = Synthesizer(load_artifact(builtin_artifact), backend)
    return {name: synth.synthesize([SpeechRequest(name, text, voice="ryan", sampling=Sampling.greedy(),
                                                  dual_track=True, max_frames=FRAMES)])[0].frames
            for name, text in TEXTS.items()}


@pytest.fixture(scope="module")
def loop(builtin_artifact, backend):
    replies: list = []
    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    loop = CohortLoop(core, ClientReplies(lambda c, m, p: replies.append(m), core.artifact.sample_rate,
                                          core.window_samples))
    loop.replies = replies
    yield loop
    loop.close()


def speak_streamed(loop: CohortLoop, pieces: list[str], every: int, others: bool = True) -> dict:
    """The first piece with the speak, then one piece every `every` loop iterations (0: all at once),
    the last one final; other whole requests alongside. Returns the done messages by id."""
    loop.replies.clear()
    greedy = Sampling.greedy()
    for r in OTHERS if others else []:
        loop.inbox.put(Submit(b"c", SpeechRequest(r.id, r.text, r.voice, sampling=greedy, dual_track=r.dual_track,
                                                  max_frames=FRAMES), play=False))
    request = SpeechRequest("s", pieces[0], voice="ryan", sampling=greedy, more_text=True, dual_track=True,
                            max_frames=FRAMES)
    loop.inbox.put(Submit(b"c", request, play=False, report_codes=True))
    rest = pieces[1:]
    for i in range(5000):
        if rest and (every == 0 or i % every == 0):
            for piece in rest if every == 0 else rest[:1]:
                loop.inbox.put(MoreText(b"c", "s", piece, final=piece is rest[-1]))
            rest = [] if every == 0 else rest[1:]
        if len(pieces) == 1 and i == 0:
            loop.inbox.put(MoreText(b"c", "s", "", final=True))
        loop.iteration()
        done = {m.id: m for m in loop.replies if isinstance(m, wire.Done)}
        if len(done) == 1 + (len(OTHERS) if others else 0):
            return done
    raise AssertionError("the loop did not finish")


@pytest.mark.parametrize("name", TEXTS)
@pytest.mark.parametrize("every", [0, 1, 4])
def test_streamed_frames_equal_the_whole_text(loop, reference, name, every):
    for cut, pieces in cuttings(TEXTS[name]).items():
        done = speak_streamed(loop, pieces, every)
        report = done["s"].report
        assert done["s"].reason == "length", (cut, done["s"].error)
        assert np.array_equal(np.array(report["rvq_codes"]), reference[name]), f"{name}, {cut}, every {every}"
        assert report["text_truncated"] is False and report["text_timed_out"] is False
        assert all(d.reason == "length" and d.report["frames"] == FRAMES for d in done.values())
        if every == 4 and cut == "characters":  # pieces slower than speech: the member waited
            assert report["text_wait_frames"] > 0 and report["text_wait_ms"] > 0


def test_a_member_out_of_text_waits_and_the_others_go_on(loop, reference):
    """Text slower than speech: the streamed member sits out many steps, the others do not."""
    pieces = list(TEXTS["english"])
    done = speak_streamed(loop, pieces, every=8)
    report = done["s"].report
    assert np.array_equal(np.array(report["rvq_codes"]), reference["english"])
    assert report["text_wait_frames"] > 20
    assert done["o1"].report["frames"] == FRAMES


def test_text_for_unknown_finished_or_closed_streams_gets_an_error(loop):
    loop.replies.clear()
    loop.inbox.put(MoreText(b"c", "nobody", "hi"))
    loop.inbox.put(Submit(b"c", SpeechRequest("whole", "Not streamed.", sampling=Sampling.greedy(), max_frames=2),
                          play=False))
    loop.inbox.put(MoreText(b"c", "whole", "more"))
    loop.inbox.put(Submit(b"c", SpeechRequest("st", "Streamed", sampling=Sampling.greedy(), more_text=True,
                                              max_frames=3), play=False))
    loop.inbox.put(MoreText(b"c", "st", " text.", final=True))
    loop.inbox.put(MoreText(b"c", "st", " too late"))
    run_until_idle(loop, limit=50)
    errors = [(m.id, m.reason) for m in loop.replies if isinstance(m, wire.Error)]
    assert errors == [("nobody", "text: no speak with id 'nobody' is in flight"),
                      ("whole", "text: speak 'whole' was not sent with more_text"),
                      ("st", "text: speak 'st' already had its final text")]
    done = {m.id: m for m in loop.replies if isinstance(m, wire.Done)}
    assert done["whole"].reason == done["st"].reason == "length"


def test_an_empty_stream_ends_with_an_error(loop):
    loop.replies.clear()
    loop.inbox.put(Submit(b"c", SpeechRequest("e", "", more_text=True), play=False))
    loop.inbox.put(MoreText(b"c", "e", "   ", final=True))
    run_until_idle(loop, limit=20)
    (done,) = [m for m in loop.replies if isinstance(m, wire.Done)]
    assert (done.reason, done.error, done.report["frames"]) == ("error", "text is empty", 0)
