"""Where a step's outputs go, and what the loop is handed to send them.

The loop imports no protocol or audio device code: the daemon hands it `Clients` (replies to the
ZeroMQ clients, built in `edged.server`), a `Speaker` (the local speaker, `edged.audio`), the
`History` thread and its `Recorder` (`edged.history`). Each vocoder window goes, in order, to the reply's speaker buffer, to
the history recorder, and to the client's stream.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edged.core import Member, Window
from edged.request import Id
from edged.scheduler.commands import Submit
from edged.scheduler.streams import TextIn


class Clients(Protocol):
    """Messages to one client (its ZeroMQ routing id): called on the loop thread only."""

    def accepted(self, client: bytes, id: Id) -> None: ...
    def rejected(self, client: bytes, id: Id, reason: str) -> None: ...
    def audio(self, client: bytes, id: Id, seq: int, format: str, first_sample: int, samples: np.ndarray) -> None: ...
    def done(self, client: bytes, id: Id, reason: str, error: str | None, report: dict) -> None: ...
    def status(self, client: bytes, fields: dict) -> None: ...
    def error(self, client: bytes, id: Id | None, reason: str) -> None: ...


class Speaker(Protocol):
    """The local speaker as the loop uses it (`edged.audio.speaker.Speaker`)."""

    @property
    def available(self) -> bool: ...
    def can_begin(self) -> bool: ...
    def begin(self, key: Hashable, id: Any) -> Any: ...
    def room(self, reply: Any) -> int: ...
    def write(self, reply: Any, pcm: np.ndarray) -> None: ...
    def end(self, reply: Any) -> None: ...
    def stop(self, reply: Any) -> None: ...
    def status(self) -> dict: ...


class History(Protocol):
    """The history thread (`edged.history.service.History`)."""

    def unreserve(self, client: bytes, id: Id, reservation: int) -> None: ...
    def ended(self, client: bytes, id: Id, reason: str, generated_ms: int, played_ms: int | None,
              pcm: np.ndarray | None, sample_rate: int, text: str | None = None) -> None: ...


class Recorder(Protocol):
    """Per-slot recordings of reply audio (`edged.history.recorder.Recorder`)."""

    def start(self, slot: int) -> None: ...
    def write(self, slot: int, first_sample: int, samples: np.ndarray) -> None: ...
    def take(self, slot: int) -> np.ndarray | None: ...


@dataclass
class Job:
    """What the loop keeps per accepted request (the scheduler entry's payload); its end state is the
    scheduler's."""

    submit: Submit
    accepted_at: float
    member: Member | None = None
    reply: Any = None
    """The reply on the local speaker (play: true with a device)."""
    seq: int = 0
    samples_sent: int = 0
    started_at: float | None = None
    first_audio_at: float | None = None
    generated_at: float | None = None
    cancelled_at_frame: int | None = None
    played: int | None = None
    """Samples heard, once the speaker is through with the reply."""
    pcm: np.ndarray | None = None
    """The whole reply's audio for calibration (asr policy), taken when generation ends."""
    text: TextIn | None = None
    """A streamed request's text (more_text)."""

    @property
    def id(self) -> Id:
        return self.submit.request.id


class Outputs:
    def __init__(self, clients: Clients, speaker: Speaker | None, recorder: Recorder | None):
        self.clients = clients
        self.speaker = speaker
        self.recorder = recorder

    def audio(self, job: Job, window: Window) -> None:
        samples = window.samples
        if job.first_audio_at is None:
            job.first_audio_at = time.monotonic()
        job.samples_sent = window.first_sample + samples.shape[0]
        if job.reply is not None and self.speaker is not None:
            self.speaker.write(job.reply, samples)
        if self.recorder is not None and job.submit.session:
            self.recorder.write(window.slot, window.first_sample, samples)
        if job.submit.stream:
            self.clients.audio(job.submit.client, job.id, job.seq, job.submit.format, window.first_sample, samples)
            job.seq += 1
