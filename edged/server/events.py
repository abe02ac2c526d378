"""The event socket: a ZeroMQ PUB that tells subscribers what the speaker and the microphone do.

Each event is a multipart message: [topic, header] or [topic, header, pcm]. The topic is the
event's name in ASCII (`vad`, `barge_in`, `playback`, `mic`, `device`), so subscribers filter with
ZeroMQ prefix subscriptions; the header is a msgpack map with `event` (the same name) and `t` (the
daemon's wall clock, seconds). docs/protocol.md lists every event and its fields.

Several threads publish (the speaker's, the microphone's, the loop's); one lock serializes them on
the one socket. Publishing never blocks: when a subscriber is slow, ZeroMQ drops its messages at the
high-water mark, never the daemon's time.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgpack
import zmq

from edged.server.sockets import bind, unbind_path

log = logging.getLogger("edged.events")

TOPICS = ("vad", "barge_in", "playback", "mic", "device")


class Events:
    def __init__(self, endpoint: str | None, context: zmq.Context | None = None,
                 curve: dict[int, Any] | None = None) -> None:
        """endpoint None: events are dropped (the config said "none"); curve: the CURVE server options
        for a tcp:// endpoint."""
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._socket: zmq.Socket | None = None
        self.dropped = 0
        """Events dropped at the high-water mark."""
        if endpoint is None:
            return
        socket = bind(context or zmq.Context.instance(), zmq.PUB, endpoint, options={zmq.SNDHWM: 2000}, curve=curve)
        self._socket = socket

    def publish(self, topic: str, header: dict[str, Any], pcm: memoryview | bytes | None = None) -> None:
        """Send one event; `pcm` (mic audio) rides as a third frame. Never blocks."""
        if self._socket is None:
            return
        head = msgpack.packb({"event": topic, "t": round(time.time(), 6), **header})
        frames: list[Any] = [topic.encode(), head] if pcm is None else [topic.encode(), head, pcm]
        with self._lock:
            try:
                self._socket.send_multipart(frames, flags=zmq.NOBLOCK)  # copies: pcm's buffer is reused
            except zmq.Again:
                self.dropped += 1

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close(linger=0)
                self._socket = None
        if self.endpoint:
            unbind_path(self.endpoint)
