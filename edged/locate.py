"""Where a client finds the daemon: this user's own daemon first, then the system daemon's socket.

A ZeroMQ ipc connect never fails, it waits for a listener; so a client that was given no endpoint,
or an ipc:// one, first checks that a daemon listens there (one plain connect), and says at once
what it tried when none does, instead of waiting out its timeout.
"""

from __future__ import annotations

import socket
from pathlib import Path

from edged.config import runtime_dir

IPC = "ipc://"
SYSTEM_SOCKET = Path("/run/edged/edged.sock")
"""The systemd unit's socket ($RUNTIME_DIRECTORY/edged.sock with RuntimeDirectory=edged)."""
GROUP_HINT = "join group edged: sudo usermod -aG edged $USER, then log in again"


class NoDaemon(ConnectionError):
    """No daemon listens where the client looked; the message names each place and why."""


def candidates() -> list[Path]:
    """The sockets a client tries, in order: this user's runtime directory (as `edged serve` run by
    this user binds it), then the system daemon's."""
    return list(dict.fromkeys([runtime_dir() / "edged.sock", SYSTEM_SOCKET]))


def why_not(path: Path) -> str | None:
    """None when something accepts connections on the socket at `path`; else why not, in words."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except FileNotFoundError:
        return "no such socket"
    except PermissionError:
        return f"permission denied ({GROUP_HINT})"
    except ConnectionRefusedError:
        return "nothing listens on it (a daemon that is not running left it)"
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        probe.close()
    return None


def daemon_endpoint(endpoint: str | None = None) -> str:
    """The endpoint to connect to. Given one: itself (an ipc:// one only when a daemon listens there).
    None: the first of `candidates()` a daemon listens on. NoDaemon otherwise, naming what was tried."""
    if endpoint is not None and not endpoint.startswith(IPC):
        return endpoint  # tcp://: nothing to look at before connecting
    paths = [Path(endpoint[len(IPC):])] if endpoint is not None else candidates()
    tried = []
    for path in paths:
        reason = why_not(path)
        if reason is None:
            return f"{IPC}{path}"
        tried.append(f"{IPC}{path}: {reason}")
    start = "" if endpoint is not None else "; start one (`edged serve`, or `sudo systemctl start edged`) or give --endpoint"
    raise NoDaemon(f"no daemon found ({'; '.join(tried)}){start}")


def preferred_endpoint() -> str:
    """For a long-running client that waits for the daemon (a front door): the first candidate with a
    daemon now, else this user's own socket."""
    try:
        return daemon_endpoint()
    except NoDaemon:
        return f"{IPC}{candidates()[0]}"
