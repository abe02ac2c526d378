"""Every ZeroMQ socket of the daemon and its clients is built here, from an endpoint string.

`bind` makes the directory of an ipc:// endpoint (mode 0700) before binding, and `unbind_path`
removes the socket file afterwards; `connect` is the client side. Security options (CURVE on TCP)
belong here too, so that every socket gets them the same way.
"""

from __future__ import annotations

from pathlib import Path

import zmq

IPC = "ipc://"


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ipc:// endpoint; None for any other transport."""
    return Path(endpoint[len(IPC):]) if endpoint.startswith(IPC) else None


def bind(context: zmq.Context, kind: int, endpoint: str, *, linger_ms: int = 0,
         options: dict[int, int] | None = None) -> zmq.Socket:
    """A socket of `kind` bound to `endpoint` (errors surface here, at boot)."""
    path = ipc_path(endpoint)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, linger_ms)
    for option, value in (options or {}).items():
        socket.setsockopt(option, value)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError:
        socket.close(linger=0)
        raise
    return socket


def connect(context: zmq.Context, kind: int, endpoint: str, *, options: dict[int, int] | None = None) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    for option, value in (options or {}).items():
        socket.setsockopt(option, value)
    socket.connect(endpoint)
    return socket


def unbind_path(endpoint: str) -> None:
    """Remove an ipc:// endpoint's socket file (after its socket is closed)."""
    path = ipc_path(endpoint)
    if path is not None:
        path.unlink(missing_ok=True)
