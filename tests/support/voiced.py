"""The daemon with a speech stand-in for its voice: `python tests/support/voiced.py SPEECH.npy serve ...`.

The built-in tiny model babbles, and no VAD takes babble for speech, so a daemon that hears its own
voice can only be tested with a voice that is speech. This launcher replaces each reply's PCM, sample
for sample, by a recording of speech (float32 at the artifact's rate, the same recording from each
reply's start, silence after its end) at the speaker's input, before the speaker's tap and ring:
everything after that write (playback, the echo reference, the listener, the canceller, the VAD)
is the daemon's own. Used by tests and scripts/bench/bargein.py only.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable

import numpy as np


def stand_in(speech: np.ndarray) -> None:
    from edged.audio.playback import Playback

    begin, write = Playback.begin, Playback.write
    positions: dict[Hashable, int] = {}

    def begin_speech(self: Playback, reply_id: Hashable) -> None:
        positions[reply_id] = 0
        begin(self, reply_id)

    def write_speech(self: Playback, reply_id: Hashable, pcm: np.ndarray) -> int:
        pos = positions.get(reply_id, 0)
        voice = np.zeros(len(pcm), dtype=np.float32)
        n = max(0, min(len(pcm), len(speech) - pos))
        voice[:n] = speech[pos:pos + n]
        accepted = write(self, reply_id, voice)
        positions[reply_id] = pos + accepted
        return accepted

    Playback.begin, Playback.write = begin_speech, write_speech  # type: ignore[method-assign]


if __name__ == "__main__":
    stand_in(np.load(sys.argv[1]).astype(np.float32))
    from edged.cli import main

    sys.exit(main(sys.argv[2:]))
