"""The loop's messages to clients, as protocol v1 messages on the server's reply pipe.

The cohort loop is handed a `ClientReplies` (it imports no protocol code itself). Every method runs
on the loop thread. s16le audio is converted in buffers claimed once, one vocoder window long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edged import protocol as wire
from edged.request import Id

Send = Callable[[bytes, Any, "memoryview | None"], None]
"""send(client, message, pcm): queue one message (and its PCM frame) for one client."""


class ClientReplies:
    def __init__(self, send: Send, sample_rate: int, window_samples: int):
        self.send = send
        self.sample_rate = sample_rate
        self.s16 = np.zeros(window_samples, dtype="<i2")
        self.scaled = np.zeros(window_samples, dtype=np.float32)

    def accepted(self, client: bytes, id: Id) -> None:
        self.send(client, wire.Accepted(id), None)

    def rejected(self, client: bytes, id: Id, reason: str) -> None:
        self.send(client, wire.Rejected(id, reason), None)

    def audio(self, client: bytes, id: Id, seq: int, format: str, first_sample: int, samples: np.ndarray) -> None:
        n = samples.shape[0]
        if format == "s16le":  # the vocoder clamps to [-1, 1]
            np.multiply(samples, 32767.0, out=self.scaled[:n])
            np.rint(self.scaled[:n], out=self.scaled[:n])
            self.s16[:n] = self.scaled[:n]
            pcm = self.s16[:n].data.cast("B")
        else:
            pcm = samples.data.cast("B")
        self.send(client, wire.Audio(id, seq, self.sample_rate, format, first_sample, n), pcm)

    def done(self, client: bytes, id: Id, reason: str, error: str | None, report: dict) -> None:
        self.send(client, wire.Done(id, reason, error, report), None)

    def status(self, client: bytes, fields: dict) -> None:
        self.send(client, wire.StatusReply(fields), None)

    def error(self, client: bytes, id: Id | None, reason: str) -> None:
        self.send(client, wire.Error(reason, id), None)
