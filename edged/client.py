"""A small synchronous client for the edged daemon (protocol v1 over a ZeroMQ DEALER socket).

    with Client() as c:
        done = c.speak("Hello.", play=False, stream=True).wait()

Several utterances may be in flight at once: replies are demultiplexed by id, and replies for
one utterance wait in a buffer while another is being read. An utterance's replies are buffered
until it is read, so read (or `wait()` on) every utterance you start.

Text that arrives while it is spoken (an LLM's tokens): `speak(..., more_text=True)`, then
`utterance.feed(piece)` as pieces come and `utterance.end()`; or `client.speak_iter(pieces)`.

One Client is used from one thread (ZeroMQ sockets are not thread-safe); use one Client per thread.

Over tcp:// to a daemon with CURVE (docs/security.md), give the daemon's public key and this
client's certificate: `Client(endpoint, server_key="server.key", certificate="me.key_secret")`, or
set $EDGED_SERVER_KEY and $EDGED_CLIENT_CERT. `subscribe` opens the event socket the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from edged import protocol
from edged.audio.wav import to_s16
from edged.locate import daemon_endpoint
from edged.protocol import Accepted, Done, Error, HistoryReply, Id, ProtocolError, Rejected, StatusReply
from edged.server.curve import client_options
from edged.server.sockets import TCP, connect

log = logging.getLogger(__name__)

DTYPES: dict[str, np.dtype] = {"f32le": np.dtype("<f4"), "s16le": np.dtype("<i2")}
SERVER_KEY_ENV, CERTIFICATE_ENV = "EDGED_SERVER_KEY", "EDGED_CLIENT_CERT"


def curve_options(endpoint: str, server_key: str | None, certificate: str | None) -> dict[int, Any]:
    """The CURVE client options for a tcp:// endpoint: the daemon's public key (Z85 or its .key file)
    and this client's certificate (its .key_secret file), each defaulting to its environment
    variable; none when neither is given or the endpoint is not tcp://."""
    server_key = server_key if server_key is not None else os.environ.get(SERVER_KEY_ENV)
    certificate = certificate if certificate is not None else os.environ.get(CERTIFICATE_ENV)
    if not endpoint.startswith(TCP) or not (server_key or certificate):
        return {}
    if not (server_key and certificate):
        raise ValueError(f"CURVE needs both the daemon's public key (server_key, ${SERVER_KEY_ENV}) and this "
                         f"client's certificate (certificate, ${CERTIFICATE_ENV})")
    return client_options(server_key, certificate)


def subscribe(endpoint: str, topics: Iterable[str] = ("",), *, server_key: str | None = None,
              certificate: str | None = None, context: zmq.Context | None = None) -> zmq.Socket:
    """A SUB socket on the daemon's event socket, subscribed to `topics` (prefixes; "" = all)."""
    socket = connect(context or zmq.Context.instance(), zmq.SUB, endpoint,
                     options=curve_options(endpoint, server_key, certificate))
    for topic in topics:
        socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
    return socket


@dataclass(frozen=True)
class Audio(protocol.Audio):
    """An `audio` reply with its samples: float32 for f32le, int16 for s16le, mono."""

    pcm: np.ndarray = field(repr=False, compare=False)


Event = Accepted | Rejected | Audio | Done


class RequestRejected(Exception):
    """The daemon rejected a speak (the request was understood but cannot be served)."""

    def __init__(self, id: Id, reason: str):
        super().__init__(f"speak {id!r} rejected: {reason}")
        self.id = id
        self.reason = reason


class ReplyOrder:
    """One speak's replies, checked against the daemon's ordering guarantees as they come: `accepted`
    (or `rejected`) first, audio seq 0, 1, 2, ... with contiguous samples, then exactly one `done`; a
    broken guarantee raises ProtocolError. Used by Utterance here and by the front doors' asyncio link."""

    def __init__(self, id: Id, format: str):
        self.id = id
        self.format = format
        self.accepted: bool | None = None
        """None until the daemon answers; then True (accepted) or False (rejected)."""
        self.rejected: str | None = None
        """Why the speak was rejected (or, for an `error` reply to it, why it could not be read)."""
        self.done: Done | None = None
        self.sample_rate: int | None = None
        self.chunks_received = 0
        self.samples_received = 0

    @property
    def finished(self) -> bool:
        return self.done is not None or self.accepted is False

    def apply(self, msg: Any, pcm: bytes | None) -> Event:
        """Take in the next reply; the event it is (an `error` reply raises ProtocolError)."""
        def broken(what: str) -> ProtocolError:
            return ProtocolError(f"speak {self.id!r}: {what}", self.id)

        if isinstance(msg, Error):
            if self.accepted is None:  # the speak itself was not understood: it is over
                self.accepted = False
                self.rejected = msg.reason
            raise ProtocolError(msg.reason, msg.id)
        if isinstance(msg, (Accepted, Rejected)):
            if self.accepted is not None:
                raise broken(f"{msg.op} after the request was already answered")
            self.accepted = isinstance(msg, Accepted)
            if isinstance(msg, Rejected):
                self.rejected = msg.reason
            return msg
        if not self.accepted:
            raise broken(f"{msg.op} before accepted")
        if isinstance(msg, Done):
            self.done = msg
            return msg
        if not isinstance(msg, protocol.Audio) or pcm is None:
            raise broken(f"unexpected {msg.op} reply")
        if msg.seq != self.chunks_received:
            raise broken(f"audio seq {msg.seq}, expected {self.chunks_received}")
        if msg.first_sample != self.samples_received:
            raise broken(f"audio first_sample {msg.first_sample}, expected {self.samples_received}")
        if msg.format != self.format:
            raise broken(f"audio format {msg.format!r}, requested {self.format!r}")
        if self.sample_rate not in (None, msg.sample_rate):
            raise broken(f"audio sample_rate changed from {self.sample_rate} to {msg.sample_rate}")
        self.sample_rate = msg.sample_rate
        self.chunks_received += 1
        self.samples_received += msg.samples
        samples = np.frombuffer(pcm, dtype=DTYPES[msg.format])
        return Audio(**{f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}, pcm=samples)


class Utterance(ReplyOrder):
    """One speak request: iterate it for its events (accepted | rejected, audio..., done), or `wait()`.
    The replies are checked as ReplyOrder says."""

    def __init__(self, client: Client, id: Id, format: str):
        super().__init__(id, format)
        self.client = client
        self.chunks: list[np.ndarray] = []
        """Every audio chunk received so far (streamed requests only)."""

    def __iter__(self) -> Iterator[Event]:
        while not self.finished:
            yield self.next_event()

    def next_event(self) -> Event:
        """The next event, waiting up to the client's timeout for it."""
        if self.finished:
            raise RuntimeError(f"speak {self.id!r} is already finished")
        what = "accepted" if self.accepted is None else f"audio or done (after {len(self.chunks)} chunks)"
        msg, pcm = self.client._next_for(self.id, f"speak {self.id!r}: {what}")
        try:
            event = self.apply(msg, pcm)
        finally:
            if self.finished:
                self.client._inbox.pop(self.id, None)
        if isinstance(event, Audio):
            self.chunks.append(event.pcm)
        return event

    def feed(self, text: str) -> bool:
        """More text for this utterance (spoken with more_text=True); False (and nothing sent) when
        the utterance is already over (rejected, or its done has come). Replies that have arrived
        meanwhile are taken in, so a long stream never leaves them queued in the socket."""
        self.client.poll()
        if self.over:
            return False
        self.client.send_text(self.id, text)
        return True

    @property
    def over(self) -> bool:
        """Rejected, or done, or either waiting to be read."""
        pending = self.client._inbox.get(self.id, ())
        return self.finished or any(isinstance(m, (Rejected, Done, Error)) for m, _ in pending)

    def end(self, text: str = "") -> None:
        """The last piece of this utterance's text: the daemon speaks what it held back, then stops."""
        self.client.poll()
        if not self.over:
            self.client.send_text(self.id, text, final=True)

    def wait(self) -> Done:
        """Read every remaining event; the `done` (raises RequestRejected if the speak was rejected)."""
        for _ in self:
            pass
        if self.done is None:
            raise RequestRejected(self.id, self.rejected or "")
        return self.done

    @property
    def pcm(self) -> np.ndarray:
        """All audio received so far, concatenated (empty unless the speak had stream: true)."""
        if not self.chunks:
            return np.zeros(0, DTYPES[self.format])
        return np.concatenate(self.chunks)

    def audio(self) -> np.ndarray:
        """Wait for the end of the utterance; all its audio."""
        self.wait()
        return self.pcm

    def cancel(self) -> None:
        self.client.cancel(self.id)

    def send_text(self, text: str, final: bool = False) -> None:
        self.client.send_text(self.id, text, final=final)

    def ack(self, played_ms: float, final: bool = False) -> None:
        self.client.ack(self.id, played_ms, final=final)


def media_layout(hidden: np.ndarray) -> dict[str, Any]:
    """The speak header's `media` for thinker hidden states [rows, width] (float16 or float32)."""
    if hidden.ndim != 2 or hidden.dtype not in (np.float16, np.float32):
        raise ValueError(f"media must be a [rows, width] float16 or float32 array, got {hidden.dtype} {hidden.shape}")
    return {"dtype": hidden.dtype.name, "shape": list(hidden.shape)}


def media_frame(hidden: np.ndarray) -> bytes:
    """The media's binary frame: row-major, little-endian."""
    return np.ascontiguousarray(hidden, hidden.dtype.newbyteorder("<")).tobytes()


class Client:
    """A connection to the daemon at `endpoint` (e.g. "ipc:///run/edged/edged.sock"). None: the first
    socket a daemon listens on of this user's own and the system daemon's (as `edged say` finds it;
    edged.locate), else NoDaemon naming both. An ipc:// endpoint nobody listens on is NoDaemon at once,
    naming why (no such socket, permission denied, nothing listens on it), as the commands say it; a
    tcp:// one is connected to as given (ZeroMQ waits for it).

    `timeout_s` bounds every wait for one reply (the next event of an utterance, a status or a
    history), not a whole utterance; it raises TimeoutError naming what was awaited. An `error`
    reply raises ProtocolError with the daemon's reason: from the utterance it names, or, when it
    names no id the client is waiting on, from whichever call waits next.
    """

    def __init__(self, endpoint: str | None = None, timeout_s: float = 30.0, *, context: zmq.Context | None = None,
                 server_key: str | None = None, certificate: str | None = None):
        """server_key, certificate: CURVE over tcp:// (module docstring); ValueError names a bad key file."""
        endpoint = daemon_endpoint(endpoint)
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._socket = connect(context or zmq.Context.instance(), zmq.DEALER, endpoint,
                               options={zmq.SNDTIMEO: max(1, int(timeout_s * 1000)),
                                        **curve_options(endpoint, server_key, certificate)})
        self._inbox: dict[Id, deque[tuple[Any, bytes | None]]] = {}
        """Replies per in-flight speak id, in arrival order."""
        self._replies: deque[HistoryReply | StatusReply] = deque()
        self._orphan_errors: deque[Error] = deque()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._socket.close(linger=0)

    # --- requests

    def speak(self, text: str, *, id: Id | None = None, more_text: bool = False, session: str | None = None,
              voice: str | None = None, language: str | None = None, instruct: str | None = None,
              play: bool = True, stream: bool = False, format: str = "f32le", max_audio_ms: int | None = None,
              sampling: dict[str, Any] | None = None, report_codes: bool = False,
              context: list[dict[str, str]] | None = None, media: np.ndarray | None = None,
              text_filter: str | None = None) -> Utterance:
        """Send a speak; its Utterance (nothing is waited for yet). `id` defaults to a fresh uuid4 hex.
        `context`: earlier turns [{role, content}] (Qwen3-Omni artifacts); `media`: the thinker's
        hidden states of the media placeholders in their user turns, [rows, width] float16 or float32;
        `text_filter`: "llm" (no reasoning, no markdown) or "none"; None: "llm" with more_text, else "none"."""
        id = uuid.uuid4().hex if id is None else id
        if id in self._inbox:
            raise ValueError(f"speak id {id!r} is already in flight on this client")
        msg = protocol.Speak(id=id, text=text, more_text=more_text, text_filter=text_filter, session=session, voice=voice,
                             language=language, instruct=instruct, play=play, stream=stream, format=format,
                             max_audio_ms=max_audio_ms, sampling=sampling, report_codes=report_codes, context=context,
                             media=None if media is None else media_layout(media))
        frames = protocol.encode(msg, None if media is None else media_frame(media))
        self._inbox[id] = deque()
        try:
            self._send(frames, f"speak {id!r}")
        except BaseException:
            del self._inbox[id]
            raise
        return Utterance(self, id, format)

    def send_text(self, id: Id, text: str, final: bool = False) -> None:
        """More text for a speak sent with more_text=True."""
        self._send(protocol.encode(protocol.Text(id=id, text=text, final=final)), f"text {id!r}")

    def speak_iter(self, pieces: Iterable[str], **speak: Any) -> Utterance:
        """Speak text as it comes from `pieces` (e.g. an LLM's tokens): a speak with more_text, each
        piece as it is yielded, then the final mark. Returns the utterance; `wait()` for its done.
        Keyword arguments are those of `speak` (voice, play, stream, session, ...)."""
        utterance = self.speak("", more_text=True, **speak)
        for piece in pieces:
            if not utterance.feed(piece):
                break  # rejected, or over (cancelled, failed, out of room): the rest is not sent
        else:
            utterance.end()
        return utterance

    def cancel(self, id: Id, any_client: bool = False) -> None:
        """Cancel this client's request `id` (`any_client`: every request in flight with that id, as
        `status` lists ids, whoever sent it)."""
        self._send(protocol.encode(protocol.Cancel(id=id, any_client=any_client)), f"cancel {id!r}")

    def ack(self, id: Id, played_ms: float, final: bool = False) -> None:
        """Report how much of a streamed utterance was heard (for clients that play audio themselves)."""
        self._send(protocol.encode(protocol.Ack(id=id, played_ms=played_ms, final=final)), f"ack {id!r}")

    def turn(self, session: str, role: str, content: str) -> None:
        """Append a user/system/assistant turn to a session's history."""
        self._send(protocol.encode(protocol.Turn(session=session, role=role, content=content)), "turn")

    def history(self, session: str, wait: bool = False, close: bool = False) -> list[dict[str, Any]]:
        """The session's turns, oldest first: [{role, content, interrupted?, response_id?, pending?}].
        wait: first let pending calibrations finish (one bounded deadline); close: then release the
        session's cursors, recordings and runs in the daemon."""
        self._send(protocol.encode(protocol.History(session=session, wait=wait, close=close)), f"history {session!r}")
        reply = self._next_reply(lambda r: isinstance(r, HistoryReply) and r.session == session,
                                 f"history {session!r}")
        assert isinstance(reply, HistoryReply)
        return reply.turns

    def messages(self, session: str) -> list[dict[str, str]]:
        """The session's history in the form an OpenAI-compatible chat takes, [{role, content}] oldest
        first, once pending calibrations are done (`history(wait=True)`): the assistant's turns as far
        as they were heard, without `history`'s other keys (interrupted, response_id, pending)."""
        return [{"role": t["role"], "content": t["content"]} for t in self.history(session, wait=True)]

    def status(self) -> dict[str, Any]:
        self._send(protocol.encode(protocol.Status()), "status")
        reply = self._next_reply(lambda r: isinstance(r, StatusReply), "status")
        assert isinstance(reply, StatusReply)
        return reply.fields

    def voice_add(self, name: str, pcm: np.ndarray, sample_rate: int, *, ref_text: str | None = None,
                  timeout_s: float | None = None) -> dict[str, Any]:
        """Enroll a voice cloned from `pcm` (mono float samples in [-1, 1], sent as s16le) at
        `sample_rate`: in context when `ref_text` (what it says) is given, x-vector only otherwise.
        Returns the voice as `voices` lists it (with `encode_ms`); a refusal raises ProtocolError with
        the daemon's reason. Encoding takes a while on a busy device: `timeout_s` (default: the
        client's) bounds the wait."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise ValueError(f"voice_add takes mono PCM, got shape {list(pcm.shape)}")
        s16 = to_s16(pcm)
        msg = protocol.VoiceAdd(name=name, sample_rate=sample_rate, samples=len(s16), format="s16le",
                                ref_text=ref_text, id=uuid.uuid4().hex)
        reply = self._call(protocol.encode(msg, s16.tobytes()), msg.id, f"voice_add {name!r}", timeout_s)
        return reply.voice

    def voice_remove(self, name: str) -> None:
        """Remove an enrolled voice; ProtocolError when there is none by that name."""
        msg = protocol.VoiceRemove(name=name, id=uuid.uuid4().hex)
        self._call(protocol.encode(msg), msg.id, f"voice_remove {name!r}")

    def voices(self) -> list[dict[str, Any]]:
        """Every voice a speak may name: [{name, kind: "builtin" | "enrolled", ...}]."""
        msg = protocol.Voices(id=uuid.uuid4().hex)
        return self._call(protocol.encode(msg), msg.id, "voices").voices

    def _call(self, frames: list[protocol.Buffer], id: Id | None, what: str, timeout_s: float | None = None) -> Any:
        """Send one voice op and wait for its one reply (matched by its id); an `error` raises."""
        assert id is not None
        self._inbox[id] = deque()
        timeout, self.timeout_s = self.timeout_s, timeout_s or self.timeout_s
        try:
            self._send(frames, what)
            reply, _ = self._next_for(id, what)
        finally:
            self.timeout_s = timeout
            del self._inbox[id]
        if isinstance(reply, Error):
            raise ProtocolError(reply.reason, reply.id)
        return reply

    def poll(self) -> None:
        """Take in every reply that has already arrived, without waiting."""
        while self._socket.poll(0, zmq.POLLIN):
            self._route(*protocol.decode_reply(self._socket.recv_multipart()))

    # --- receiving: one loop, replies routed by id

    def _send(self, frames: list[protocol.Buffer], what: str) -> None:
        try:
            self._socket.send_multipart(frames)
        except zmq.Again:
            raise TimeoutError(f"{what}: could not send within {self.timeout_s:g} s") from None

    def _next_for(self, id: Id, what: str) -> tuple[Any, bytes | None]:
        """The next reply for speak `id`."""
        self._pump(lambda: bool(self._inbox.get(id)), what)
        return self._inbox[id].popleft()

    def _next_reply(self, match: Callable[[Any], bool], what: str) -> HistoryReply | StatusReply:
        def found() -> bool:
            return any(match(r) for r in self._replies)

        self._pump(found, what)
        reply = next(r for r in self._replies if match(r))
        self._replies.remove(reply)
        return reply

    def _pump(self, ready: Callable[[], bool], what: str) -> None:
        """Receive and route replies until `ready()`, for at most timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._orphan_errors:
                err = self._orphan_errors.popleft()
                raise ProtocolError(err.reason, err.id)
            if ready():
                return
            left_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._socket.poll(left_ms, zmq.POLLIN):
                raise TimeoutError(f"{what}: no reply within {self.timeout_s:g} s")
            self._route(*protocol.decode_reply(self._socket.recv_multipart()))

    def _route(self, msg: Any, pcm: bytes | None) -> None:
        if isinstance(msg, (HistoryReply, StatusReply)):
            self._replies.append(msg)
        elif msg.id in self._inbox:
            self._inbox[msg.id].append((msg, pcm))
        elif isinstance(msg, Error):
            self._orphan_errors.append(msg)
        else:
            log.warning("dropping %s for id %r: no speak with that id is in flight", msg.op, msg.id)
