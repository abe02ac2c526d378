"""The ZeroMQ front: a ROUTER socket on its own thread, talking to the cohort loop through queues.

Client messages are decoded here (one module decodes: `edged.protocol`) and handed to the loop's
inbox as commands; anything that cannot be understood gets an `error` reply at once and the server
carries on. The loop answers through a PUSH socket that only the loop thread uses; this thread
forwards those replies to the ROUTER, so each socket is owned by exactly one thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from dataclasses import replace
from typing import Any

import numpy as np
import zmq

from edged import protocol as wire
from edged.history.service import Ack, AddTurn, History, Query, Reserve
from edged.llm_text import LlmText, filter_llm_text
from edged.request import Sampling, SpeechRequest
from edged.scheduler.commands import Cancel, ClientLost, MoreText, StatusQuery, Submit
from edged.server.sockets import bind, connect, unbind_path
from edged.voices.service import VoiceCommand, VoiceService

log = logging.getLogger("edged.server")

REPLIES = "inproc://edged-replies"
HARD_LIMIT_FACTOR = 16  # zmq drops (disconnects) only messages this many times over the limit


def media_rows(layout: dict, blob: bytes | None) -> np.ndarray:
    """A speak's media frame as the [rows, width] array its header describes (decode checked the size)."""
    return np.frombuffer(blob or b"", np.dtype(layout["dtype"]).newbyteorder("<")).reshape(layout["shape"])


class Server:
    def __init__(self, endpoint: str, inbox: queue.SimpleQueue, *, max_message_bytes: int, defaults: Sampling,
                 frame_ms: float, history: History | None = None, curve: dict[int, Any] | None = None,
                 no_history: str = "this daemon keeps no history", client_queue: int = 1000,
                 voices: VoiceService | None = None, no_voices: str = "this model cannot clone voices",
                 builtin_voices: list[dict[str, Any]] | None = None):
        """inbox: the cohort loop's; frame_ms: one codec frame, to turn max_audio_ms into frames; curve:
        the CURVE server options for a tcp:// endpoint (edged/server/curve.py); no_history: why a
        history op (or a speak with a session) is refused when there is no history; client_queue:
        messages queued for one client before it counts as not reading (daemon.client_queue); voices:
        the voice thread (None: `voices` is answered here with `builtin_voices`, the artifact's
        speakers, and voice_add / voice_remove get `error` with `no_voices`)."""
        self.endpoint = endpoint
        self.reservations = itertools.count(1)
        """Each speak's number, for its history reservation."""
        self.curve = curve
        self.inbox = inbox
        self.frame_ms = frame_ms
        self.history = history
        self.no_history = no_history
        self.voices = voices
        self.no_voices = no_voices
        self.builtin_voices = builtin_voices or []
        self.client_queue = client_queue
        self.max_bytes = max_message_bytes
        self.defaults = defaults
        self.context: zmq.Context = zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind (errors surface here, at boot) and start the socket thread."""
        self.router = bind(self.context, zmq.ROUTER, self.endpoint, options={
            zmq.MAXMSGSIZE: self.max_bytes * HARD_LIMIT_FACTOR, zmq.ROUTER_MANDATORY: 1, zmq.SNDHWM: self.client_queue},
            curve=self.curve)
        self.replies_in = bind(self.context, zmq.PULL, REPLIES)
        self._push = connect(self.context, zmq.PUSH, REPLIES)  # used by the loop thread only
        self._thread = threading.Thread(target=self._serve, name="edged-zmq", daemon=True)
        self._thread.start()

    def reply(self, client: bytes, message, pcm: memoryview | None) -> None:
        """Called on the loop thread: queue one message for one client."""
        self._push.send_multipart([client, *wire.encode(message, pcm)], copy=True)

    def stop(self) -> None:
        """Called on the loop thread: every reply queued before this call reaches the ROUTER first."""
        self._push.send_multipart([b""])  # end marker: behind every reply already queued
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._push.close(linger=0)
        self.replies_in.close(linger=0)
        self.router.close(linger=2000)  # let the last `done` messages leave, but never hang the exit
        unbind_path(self.endpoint)

    # ----------------------------------------------------------------------------- socket thread

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.replies_in, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(100))
            if self.replies_in in ready:
                while True:
                    try:
                        frames = self.replies_in.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames == [b""]:  # stop(): every earlier reply is out
                        self._stop.set()
                        break
                    self._send(frames)
            if self.router in ready:
                while True:
                    try:
                        frames = self.router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._receive(frames[0], frames[1:])

    def _send(self, frames: list) -> None:
        """One message to one client, never blocking: a client that is gone (mandatory routing) or
        not reading (its queue at the high-water mark) loses the message, and the loop ends its
        requests (`done` error "client gone" / "client not reading", sent if it still can be)."""
        try:
            self.router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            reason = "client gone" if exc.errno == zmq.EHOSTUNREACH else "client not reading"
            log.warning("undeliverable %s: %s", wire.summary(frames[1:]), reason)
            self.inbox.put(ClientLost(bytes(frames[0]), reason))

    def _receive(self, client: bytes, frames: list[bytes]) -> None:
        try:
            message, blob = wire.decode(frames, max_bytes=self.max_bytes)
            command = self._command(client, message, blob)
        except wire.ProtocolError as exc:
            log.warning("bad message: %s", exc.reason, extra={"request_id": str(exc.id) if exc.id is not None else ""})
            self._send([client, *wire.encode(wire.Error(exc.reason, exc.id))])
            return
        if command is not None:
            self.inbox.put(command)

    def _command(self, client: bytes, message, blob: bytes | None):
        """The loop's command for a message; None when the history thread takes it instead."""
        if isinstance(message, wire.Speak):
            request = self._request(message, blob)
            session = message.session or None
            reservation = next(self.reservations)
            if session is not None:  # the reply's slot in the history comes before anything sent after it
                spoken = request.text  # for a stream, replaced by all of its spoken text when it ends
                if request.more_text and request.text_filter == "llm":
                    spoken = LlmText().feed(request.text)
                self._history(message).inbox.put(Reserve(client, message.id, session, spoken, message.voice,
                                                         local=message.play, reservation=reservation))
            return Submit(client, request, stream=message.stream, format=message.format, play=message.play,
                          report_codes=message.report_codes, session=session, reservation=reservation)
        if isinstance(message, wire.Text):
            return MoreText(client, message.id, message.text, message.final)
        if isinstance(message, wire.Cancel):
            return Cancel(client, message.id, message.any_client)
        if isinstance(message, wire.Status):
            return StatusQuery(client)
        if isinstance(message, wire.Ack):
            self._history(message).inbox.put(Ack(client, message))
            return None
        if isinstance(message, wire.Turn):
            self._history(message).inbox.put(AddTurn(client, message))
            return None
        if isinstance(message, wire.History):
            self._history(message).inbox.put(Query(client, message))
            return None
        if isinstance(message, (wire.VoiceAdd, wire.VoiceRemove, wire.Voices)):
            if self.voices is None and isinstance(message, wire.Voices):
                self._send([client, *wire.encode(wire.VoicesReply(self.builtin_voices, message.id))])
                return None
            if self.voices is None:
                raise wire.ProtocolError(f"{message.op}: {self.no_voices}", message.id)
            self.voices.inbox.put(VoiceCommand(client, message, blob))
            return None
        raise wire.ProtocolError(f"op {message.op!r} is not supported by this daemon yet", getattr(message, "id", None))

    def _history(self, message) -> History:
        if self.history is None:
            raise wire.ProtocolError(f"{message.op}: {self.no_history}", getattr(message, "id", None))
        return self.history

    def _request(self, m: wire.Speak, blob: bytes | None) -> SpeechRequest:
        # values are range-checked at admission (a bad value is a `rejected`, not an `error`)
        sampling = replace(self.defaults, **{k: v for k, v in (m.sampling or {}).items() if v is not None})
        max_frames = max(1, int(m.max_audio_ms // self.frame_ms)) if m.max_audio_ms else None
        clone = self.voices.book.get(m.voice) if self.voices is not None else None
        text_filter = m.text_filter or ("llm" if m.more_text else "none")
        text = filter_llm_text(m.text) if text_filter == "llm" and not m.more_text else m.text  # a stream's: the loop's
        return SpeechRequest(id=m.id, text=text, voice=m.voice, language=m.language, instruct=m.instruct, clone=clone,
                             sampling=sampling, max_frames=max_frames, more_text=m.more_text, text_filter=text_filter,
                             dual_track=True if m.more_text else None,
                             context=tuple((t["role"], t["content"]) for t in m.context or ()),
                             media=None if m.media is None else media_rows(m.media, blob))
