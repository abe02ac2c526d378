"""The turn-taker (edged/converse/turns.py) on the microphone's clock: pre-roll kept, a turn ends
only after the end silence, a start inside that silence continues it (unless it is the reply's own
echo), the reply's own echo is never a turn, a turn that never stops is cut at its longest."""

from __future__ import annotations

import numpy as np
import pytest

from edged.converse.turns import RATE, TurnTaker

CHUNK = 512  # the `mic` events' size


def feed(taker: TurnTaker, events: dict[int, tuple], until: int) -> list:
    """Mic chunks of a ramp (sample i has value i % 30000) up to `until`, with each `vad` event
    (state, while_playing, near_end) given at the chunk its mic_sample falls in; the turns made."""
    turns = []
    for first in range(0, until, CHUNK):
        for sample, (state, playing, near) in sorted(events.items()):
            if first <= sample < first + CHUNK:
                taker.vad(state, sample, while_playing=playing, near_end=near)
        pcm = (np.arange(first, first + CHUNK) % 30000).astype(np.int16)
        if (turn := taker.mic(first, pcm)) is not None:
            turns.append(turn)
    return turns


def ms(v: float) -> int:
    return int(v * RATE / 1000)


def test_a_turn_keeps_its_preroll_and_ends_after_the_end_silence():
    taker = TurnTaker(preroll_ms=300, end_silence_ms=600)
    start, stop = ms(2000), ms(3500)
    (turn,) = feed(taker, {start: ("start", False, False), stop: ("stop", False, False)}, ms(6000))
    assert (turn.speech_start, turn.speech_end) == (start, stop)
    assert turn.start == start - ms(300)  # the first syllable, before the VAD decided
    assert stop + ms(600) <= turn.decided < stop + ms(600) + CHUNK  # decided on the first chunk past the silence
    assert 600 <= turn.decided_ms < 600 + CHUNK * 1000 / RATE
    assert np.array_equal(turn.pcm, (np.arange(turn.start, turn.decided) % 30000).astype(np.int16))


def test_speech_again_within_the_silence_is_the_same_turn():
    taker = TurnTaker(preroll_ms=300, end_silence_ms=600)
    events = {ms(1000): ("start", False, False), ms(2000): ("stop", False, False),
              ms(2400): ("start", False, False), ms(3000): ("stop", False, False)}
    (turn,) = feed(taker, events, ms(5000))
    assert (turn.speech_start, turn.speech_end) == (ms(1000), ms(3000))
    two = feed(TurnTaker(preroll_ms=300, end_silence_ms=300), events, ms(5000))
    assert [(t.speech_start, t.speech_end) for t in two] == [(ms(1000), ms(2000)), (ms(2400), ms(3000))]


def test_the_replys_echo_is_never_a_turn_and_a_user_over_it_is():
    taker = TurnTaker()
    echo = {ms(500): ("start", True, False), ms(1500): ("stop", True, False)}
    assert feed(taker, echo, ms(3000)) == []
    user = {ms(4000): ("start", True, True), ms(5000): ("stop", True, True)}
    (turn,) = feed(taker, {**echo, **user}, ms(7000))
    assert turn.speech_start == ms(4000)


def test_a_turn_that_never_stops_is_cut_at_its_longest_and_the_preroll_never_reaches_before_the_start():
    taker = TurnTaker(preroll_ms=300, end_silence_ms=600, max_turn_s=2.0)
    (turn,) = feed(taker, {ms(100): ("start", False, False)}, ms(4000))
    assert turn.start == 0 and turn.speech_start == ms(100)  # only 100 ms existed before the start
    assert turn.decided - turn.speech_start >= ms(2000) and turn.speech_end == turn.decided
    assert len(turn.pcm) == turn.decided - turn.start


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_turn_s > 0"):
        TurnTaker(max_turn_s=0)


def test_the_replys_echo_in_a_turns_end_silence_neither_continues_nor_ends_it():
    """The user stops; in their end silence a reply starts to play and the VAD starts on its echo
    (while_playing, not near_end) and stops: the turn ends where the user stopped, decided one end
    silence after that stop, and neither of the echo's events counted. The user speaking over the
    reply in that silence (near_end) continues the turn."""
    taker = TurnTaker(preroll_ms=300, end_silence_ms=600)
    said = {ms(1000): ("start", False, False), ms(2000): ("stop", False, False)}
    echo = {ms(2200): ("start", True, False), ms(2700): ("stop", True, False)}
    (turn,) = feed(taker, {**said, **echo}, ms(5000))
    assert (turn.speech_start, turn.speech_end) == (ms(1000), ms(2000))
    assert ms(2600) <= turn.decided < ms(2600) + CHUNK
    counted = TurnTaker()
    assert counted.vad("start", 10, while_playing=False) and not counted.vad("start", 20, while_playing=True,
                                                                             near_end=False)
    assert counted.vad("stop", 30) and not counted.vad("stop", 40)  # a stop counts after a start that did
    over = {ms(2200): ("start", True, True), ms(2700): ("stop", True, True)}
    (turn,) = feed(TurnTaker(preroll_ms=300, end_silence_ms=600), {**said, **over}, ms(5000))
    assert (turn.speech_start, turn.speech_end) == (ms(1000), ms(2700))
