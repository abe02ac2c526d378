"""Every ZeroMQ socket of the daemon and its clients is built here, from an endpoint string.

`bind` makes the directory of an ipc:// endpoint before binding (mode 0750; a directory that exists
keeps its mode: systemd's RuntimeDirectoryMode, or an admin's) and gives the socket file mode 0660,
so only the daemon's user and group can connect; `unbind_path` removes the socket file afterwards;
`connect` is the client side. A tcp:// socket gets the CURVE server options when keys are given
(edged/server/curve.py), so every TCP socket of the daemon is guarded the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

IPC = "ipc://"
TCP = "tcp://"
DIR_MODE, SOCKET_MODE = 0o750, 0o660


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ipc:// endpoint; None for any other transport."""
    return Path(endpoint[len(IPC):]) if endpoint.startswith(IPC) else None


def bind(context: zmq.Context, kind: int, endpoint: str, *, linger_ms: int = 0,
         options: dict[int, Any] | None = None, curve: dict[int, Any] | None = None) -> zmq.Socket:
    """A socket of `kind` bound to `endpoint` (errors surface here, at boot); `curve`: the CURVE
    server options, applied when the endpoint is tcp://."""
    path = ipc_path(endpoint)
    if path is not None and not path.parent.exists():
        path.parent.mkdir(parents=True, mode=DIR_MODE)
        path.parent.chmod(DIR_MODE)  # mkdir's mode is masked by the umask
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, linger_ms)
    for option, value in {**(options or {}), **(curve if endpoint.startswith(TCP) and curve else {})}.items():
        socket.setsockopt(option, value)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError:
        socket.close(linger=0)
        raise
    if path is not None:
        path.chmod(SOCKET_MODE)
    return socket


def connect(context: zmq.Context, kind: int, endpoint: str, *, options: dict[int, Any] | None = None) -> zmq.Socket:
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
