"""Where a user's turn starts and ends, on the microphone's own clock: the daemon's echo-cancelled
`mic` audio (16 kHz) and its `vad` events, both numbered by `mic_sample`.

A turn starts at a VAD start and keeps `preroll_ms` of the audio before it (the VAD decides after a
word has begun: its first syllable is there). It ends once `end_silence_ms` of microphone audio has
come after a VAD stop with no new start; a start within that silence continues the same turn. A start
while the daemon's reply plays counts only when the echo canceller put it above the reply's echo
(`near_end`, as the daemon's own barge-in gate does): the daemon's own voice is never a turn. Time is
the microphone's samples, never the wall clock, so a slow machine decides the same turns.

Bookkeeping only: `mic()` returns the turns it completed; no sockets, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 16000
"""The `mic` events' sample rate."""


@dataclass(frozen=True)
class Turn:
    start: int
    """Mic sample of the turn's audio's first sample (the VAD's start less the pre-roll)."""
    speech_start: int
    """The VAD's start."""
    speech_end: int
    """The VAD's last stop: the end of speech."""
    decided: int
    """The mic sample at which the turn was decided over (end of speech + the end silence, or later)."""
    pcm: np.ndarray
    """int16 mono at 16 kHz, from `start` to `decided`."""

    @property
    def decided_ms(self) -> float:
        """From the end of speech to the end of the turn decided, on the microphone's clock."""
        return (self.decided - self.speech_end) * 1000 / RATE


class TurnTaker:
    def __init__(self, *, preroll_ms: int = 300, end_silence_ms: int = 600, max_turn_s: float = 30.0):
        if preroll_ms < 0 or end_silence_ms < 0 or max_turn_s <= 0:
            raise ValueError("preroll_ms and end_silence_ms must be >= 0 and max_turn_s > 0")
        self.preroll = preroll_ms * RATE // 1000
        self.end_silence = end_silence_ms * RATE // 1000
        self.max_turn = int(max_turn_s * RATE)
        self.ring = np.zeros(self.preroll + self.max_turn + RATE, np.int16)  # claimed once
        self.end = 0
        """One past the newest mic sample received."""
        self.speech_start: int | None = None
        self.speech_end: int | None = None
        """The last VAD stop of the turn in progress (None while speech goes on)."""
        self.speaking = False
        """A start counted, its stop not yet."""

    @property
    def in_turn(self) -> bool:
        return self.speech_start is not None

    def vad(self, state: str, mic_sample: int, *, while_playing: bool = False, near_end: bool = True) -> bool:
        """A `vad` event; whether it counted. A start over a reply that the canceller did not put above
        its echo is the reply's own (as the daemon's gate judges it): ignored, whether it would begin a
        turn or continue one in its end silence, and so is the stop that ends it; a stop counts only
        after a start that did."""
        if state == "start":
            if while_playing and not near_end:
                return False
            if self.speech_start is None:
                self.speech_start = mic_sample
            self.speech_end = None
            self.speaking = True
            return True
        if state == "stop" and self.speaking and self.speech_start is not None:
            self.speech_end = max(mic_sample, self.speech_start)
            self.speaking = False
            return True
        return False

    def mic(self, first_sample: int, pcm: np.ndarray) -> Turn | None:
        """A `mic` chunk (int16); the turn it completed, if any."""
        n, size = len(pcm), len(self.ring)
        at = first_sample % size
        head = min(n, size - at)
        self.ring[at:at + head] = pcm[:head]
        self.ring[:n - head] = pcm[head:]
        self.end = first_sample + n
        if self.speech_start is None:
            return None
        too_long = self.end - self.speech_start >= self.max_turn
        if too_long and self.speech_end is None:
            self.speech_end = self.end
        if self.speech_end is None or (self.end - self.speech_end < self.end_silence and not too_long):
            return None
        return self._close()

    def _close(self) -> Turn:
        assert self.speech_start is not None and self.speech_end is not None
        start = max(self.speech_start - self.preroll, self.end - len(self.ring) + 1, 0)
        idx = np.arange(start, self.end) % len(self.ring)
        turn = Turn(start, self.speech_start, self.speech_end, self.end, self.ring[idx])
        self.speech_start = self.speech_end = None
        self.speaking = False
        return turn
