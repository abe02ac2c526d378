"""What other threads hand the cohort loop, through its inbox (a queue): one class per command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edged.request import Id, SpeechRequest


@dataclass(frozen=True)
class Submit:
    client: bytes
    request: SpeechRequest
    stream: bool = False
    format: str = "f32le"
    play: bool = True
    report_codes: bool = False
    session: str | None = None
    """The conversation whose history gets this reply (the history thread reserved its slot)."""
    reservation: int = 0
    """The number of that reservation (history.service.Reserve)."""


@dataclass(frozen=True)
class MoreText:
    """A piece of a streamed request's text (`final`: the last)."""

    client: bytes
    id: Id
    text: str
    final: bool = False


@dataclass(frozen=True)
class Cancel:
    client: bytes
    id: Id
    any_client: bool = False
    """Every request in flight with this id (compared as strings, as status lists ids), of any client."""


@dataclass(frozen=True)
class StatusQuery:
    client: bytes


@dataclass(frozen=True)
class PlaybackEnded:
    """From the speaker: the reply's last sample (or its cut) has passed the DAC."""

    reply: Any


@dataclass(frozen=True)
class ClientLost:
    """From the socket thread: a message to `client` could not be delivered (`reason`: "client gone"
    or "client not reading"); its requests end."""

    client: bytes
    reason: str


@dataclass(frozen=True)
class Drain:
    """Stop admitting; finish what is in flight until `deadline` (monotonic), then cancel the rest."""

    deadline: float


Command = Submit | MoreText | Cancel | StatusQuery | PlaybackEnded | ClientLost | Drain
