"""The front doors' way to the daemon: one asyncio ZeroMQ DEALER socket shared by every request of a
front door process, replies routed by id (the same protocol and checks as `edged.client`).

    link = DaemonLink("ipc:///run/edged/edged.sock")
    await link.start()
    speech = await link.speak("Hello.", format="s16le")   # play: false, stream: true
    async for event in speech: ...                       # Accepted | Rejected, Audio..., Done

The socket connects with ZMQ_IMMEDIATE, so a message is never queued for a daemon that is not there:
a send that finds no daemon within `connect_s` raises DaemonDown (the HTTP door's 503), as does a
status or voices query with no answer within `timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from edged import protocol
from edged.client import Event, ReplyOrder, curve_options
from edged.protocol import Done, Error, Id, ProtocolError, Rejected, StatusReply, VoicesReply
from edged.server.sockets import connect

log = logging.getLogger(__name__)


class DaemonDown(Exception):
    """The daemon is not running, or did not answer in time."""


class Speech(ReplyOrder):
    """One speak through the link: its events in order (`async for`, or `next()`), more text, cancel."""

    def __init__(self, link: DaemonLink, id: Id, format: str):
        super().__init__(id, format)
        self.link = link
        self.inbox: asyncio.Queue[tuple[Any, bytes | None]] = asyncio.Queue()
        self.cancelling = False

    async def next(self) -> Event:
        """The next event; DaemonDown when none comes within the link's timeout_s."""
        try:
            msg, pcm = await asyncio.wait_for(self.inbox.get(), self.link.timeout_s)
        except TimeoutError:
            raise DaemonDown(f"speak {self.id!r}: no reply from the daemon within {self.link.timeout_s:g} s") from None
        try:
            return self.apply(msg, pcm)
        finally:
            if self.finished:
                self.link.routes.pop(self.id, None)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self.finished:
            yield await self.next()

    async def text(self, text: str, final: bool = False) -> None:
        """More text (the speak was sent with more_text)."""
        await self.link.send(protocol.encode(protocol.Text(id=self.id, text=text, final=final)))

    async def cancel(self) -> None:
        """Cancel it if it is still running. Its last replies (up to `done`, within a frame) still come
        to whoever reads on; the link forgets it at its `done` whether or not anyone does."""
        if not self.finished and not self.cancelling:
            self.cancelling = True
            await self.link.send(protocol.encode(protocol.Cancel(id=self.id)))


class DaemonLink:
    def __init__(self, endpoint: str, *, timeout_s: float = 30.0, connect_s: float = 1.0,
                 server_key: str | None = None, certificate: str | None = None):
        """timeout_s: the longest wait for any one reply; connect_s: for the daemon to take a message.
        server_key, certificate: CURVE over tcp:// (as edged.client.Client)."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.connect_s = connect_s
        self.options = {zmq.IMMEDIATE: 1, **curve_options(endpoint, server_key, certificate)}
        self.routes: dict[Id, Speech] = {}
        """In-flight speaks by id."""
        self.calls: dict[Id, asyncio.Future] = {}
        """`voices` queries waiting for their reply, by id."""
        self.statuses: list[asyncio.Future] = []
        """`status` queries waiting, oldest first (status replies carry no id)."""
        self.socket: Any = None
        """A zmq.asyncio DEALER, once started."""
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        self.socket = connect(zmq.asyncio.Context.instance(), zmq.DEALER, self.endpoint, options=self.options)
        self._reader = asyncio.create_task(self._read(), name="edged link reader")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.socket is not None:
            self.socket.close(linger=0)

    async def speak(self, text: str, **fields: Any) -> Speech:
        """Send a speak (fields as protocol.Speak; play defaults to false, stream to true)."""
        msg = protocol.Speak(id=uuid.uuid4().hex, text=text, **{"play": False, "stream": True, **fields})
        speech = self.routes[msg.id] = Speech(self, msg.id, msg.format)
        try:
            await self.send(protocol.encode(msg))
        except BaseException:
            del self.routes[msg.id]
            raise
        return speech

    async def status(self) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        self.statuses.append(future)
        try:
            await self.send(protocol.encode(protocol.Status()))
            reply = await self._answer(future, "status")
        finally:
            if future in self.statuses:
                self.statuses.remove(future)
        return reply.fields

    async def voices(self) -> list[dict[str, Any]]:
        msg = protocol.Voices(id=uuid.uuid4().hex)
        assert msg.id is not None
        future = self.calls[msg.id] = asyncio.get_running_loop().create_future()
        try:
            await self.send(protocol.encode(msg))
            reply = await self._answer(future, "voices")
        finally:
            self.calls.pop(msg.id, None)
        if isinstance(reply, Error):
            raise ProtocolError(reply.reason, reply.id)
        return reply.voices

    async def send(self, frames: list[protocol.Buffer]) -> None:
        assert self.socket is not None, "start() the link first"
        try:
            await self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
        # no connected daemon: wait a moment for one (the link may just have started)
        if not await self.socket.poll(int(self.connect_s * 1000), zmq.POLLOUT):
            raise DaemonDown(f"the daemon at {self.endpoint} is not running (no connection within {self.connect_s:g} s)")
        await self.socket.send_multipart(frames, flags=zmq.NOBLOCK)

    async def _answer(self, future: asyncio.Future, what: str) -> Any:
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise DaemonDown(f"{what}: no reply from the daemon at {self.endpoint} within {self.timeout_s:g} s") from None

    async def _read(self) -> None:
        assert self.socket is not None
        while True:
            frames = await self.socket.recv_multipart()
            try:
                msg, pcm = protocol.decode_reply(frames)
            except ProtocolError as exc:
                log.error("a reply from the daemon could not be read: %s", exc.reason)
                continue
            self._route(msg, pcm)

    def _route(self, msg: Any, pcm: bytes | None) -> None:
        if isinstance(msg, StatusReply):
            if self.statuses:
                self.statuses.pop(0).set_result(msg)
            return
        id: Any = getattr(msg, "id", None)
        if isinstance(msg, VoicesReply) or (id in self.calls):
            future = self.calls.get(id)
            if future is not None and not future.done():
                future.set_result(msg)
            return
        speech = self.routes.get(id)
        if speech is not None:
            speech.inbox.put_nowait((msg, pcm))
            if speech.cancelling and isinstance(msg, (Done, Rejected, Error)):
                del self.routes[id]
        elif isinstance(msg, Error):
            log.warning("the daemon said: %s", msg.reason)
        else:
            log.debug("dropping %s for id %r: not in flight (cancelled, or its client is gone)", msg.op, id)
