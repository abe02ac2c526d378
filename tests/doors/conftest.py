"""One daemon (greedy, as every test daemon) with both front doors in front of it, for a module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from support.daemon import Daemon
from support.doors import Door, http, wyoming

from edged.client import Client
from edged.protocol import Accepted

API_KEY = "test-key-of-the-http-door"


@dataclass
class Front:
    daemon: Daemon
    wyoming: Door
    http: Door
    api_key: str = API_KEY
    """What the HTTP door asks of its clients."""

    def reference(self, text: str | list[str], voice: str | None = None, language: str | None = None,
                  instruct: str | None = None) -> bytes:
        """The daemon's own s16le stream for the same request (pieces: streamed text)."""
        with Client(self.daemon.endpoint, timeout_s=120) as client:
            options = dict(voice=voice, language=language, instruct=instruct, play=False, stream=True, format="s16le")
            if isinstance(text, list):
                utterance = client.speak_iter(text, **options)
            else:
                utterance = client.speak(text, **options)
            pcm = utterance.audio()
        assert pcm.dtype == np.int16 and len(pcm) > 0
        return pcm.tobytes()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The daemon answering `busy`: speaks that never end (streamed text, never final) fill its cohort
        and its queue, one by one until one is refused; cancelled on the way out."""
        with Client(self.daemon.endpoint) as holder:
            held = []
            try:
                while True:
                    utterance = holder.speak("", more_text=True, play=False)
                    if not isinstance(utterance.next_event(), Accepted):
                        assert utterance.rejected is not None and utterance.rejected.startswith("busy"), utterance.rejected
                        break
                    held.append(utterance)
                yield
            finally:
                for utterance in held:
                    utterance.cancel()
                for utterance in held:
                    assert utterance.wait().reason == "cancelled"

    def done_count(self, reason: str) -> int:
        with Client(self.daemon.endpoint) as client:
            return client.status()["counters"]["done"].get(reason, 0)


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    (tmp / "api.key").write_text(API_KEY + "\n")
    daemon = Daemon(tmp, config="[daemon]\nqueue_limit = 8\n")
    doors: list[Door] = []
    try:
        doors.append(wyoming(tmp, daemon.endpoint))
        doors.append(http(tmp, daemon.endpoint, "--api-key-file", str(tmp / "api.key")))
        yield Front(daemon, *doors)
    finally:
        codes = [door.close() for door in doors]
        daemon.close()
        assert codes == [0] * len(doors), [door.read_log() for door in doors]
