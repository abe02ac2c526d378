"""sd_notify(3): tell systemd the daemon is ready, what it is doing, that it is alive, that it stops.

Every message goes to the datagram socket named by $NOTIFY_SOCKET (a path, or "@name" for an
abstract socket). Outside systemd there is no $NOTIFY_SOCKET and every method is a no-op, so the
daemon calls them unconditionally. A few lines of pure Python send, as sd_notify does, but
never block: the daemon's loop sends STATUS and WATCHDOG, and a manager (or test) that stops reading
must not stop the daemon; a full socket drops the message (logged once). systemd-python's
sd_notify (the `systemd` extra, whose send blocks on a full socket) can be chosen explicitly.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Literal

log = logging.getLogger("edged.systemd")

Backend = Literal["auto", "systemd", "socket"]


def _socket_notify(address: str, message: str) -> None:
    """The pure-Python sender: one datagram to $NOTIFY_SOCKET, as sd_notify sends it."""
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    elif not address.startswith("/"):
        raise OSError(f"NOTIFY_SOCKET={address!r}: only path and @abstract sockets are supported")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.send(message.encode(), socket.MSG_DONTWAIT)  # a full socket raises BlockingIOError


def _systemd_python_notify() -> Callable[[str, str], None] | None:
    try:
        import systemd.daemon  # systemd-python: the `systemd` extra
    except ImportError:
        return None

    def send(_address: str, message: str) -> None:
        systemd.daemon.notify(message)  # reads $NOTIFY_SOCKET itself; raises OSError on failure

    return send


class Notifier:
    """Sends sd_notify messages; a no-op (every method returns False) when $NOTIFY_SOCKET is unset.

    backend: "socket" (and "auto") = the pure-Python, non-blocking sender; "systemd" = systemd-python's
    sd_notify (the `systemd` extra).

    Never raises: a failed send is logged (once, until a send succeeds again) and returns False.
    A lost READY=1 shows up anyway as systemd's start timeout; a lost WATCHDOG=1 as a restart.
    """

    def __init__(self, backend: Backend = "auto") -> None:
        self.address: str | None = os.environ.get("NOTIFY_SOCKET") or None
        sender = _systemd_python_notify() if backend == "systemd" else None
        if backend == "systemd" and sender is None:
            raise ImportError("Notifier(backend='systemd') needs systemd-python (it builds against libsystemd-dev; "
                              "`make install-dev` and `sudo make install-system` install both)")
        self.backend: str = "systemd" if sender is not None else "socket"
        self._send = sender or _socket_notify
        self._failing = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Sends fields ("KEY=value", one per line) as one message; True when it was delivered."""
        if self.address is None:
            return False
        try:
            self._send(self.address, "\n".join(fields))
        except OSError as exc:
            if not self._failing:
                log.warning("sd_notify to %s failed (%s): %s", self.address, ", ".join(fields), exc)
            self._failing = True
            return False
        if self._failing:
            log.info("sd_notify to %s works again", self.address)
        self._failing = False
        return True

    def ready(self) -> bool:
        """READY=1: boot is over (every buffer claimed, socket bound); systemd starts dependents."""
        return self.send("READY=1")

    def status(self, line: str) -> bool:
        """STATUS=line: one line shown by `systemctl status edged`."""
        return self.send("STATUS=" + " ".join(line.splitlines()))

    def watchdog(self) -> bool:
        """WATCHDOG=1: alive. Normally sent by `Watchdog`, which knows whether the loop progresses."""
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        """STOPPING=1: the drain has begun."""
        return self.send("STOPPING=1")

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC (Type=notify-reload); send ready() when the reload is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: boot (or the drain) needs `seconds` more than TimeoutStartSec/StopSec."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")


class BootProgress:
    """EXTEND_TIMEOUT_USEC while the boot makes progress (systemd.service, TimeoutStartSec=: "the
    service must send a new message" within each extension): `step()` is called as each part of the
    boot is done (an engine deserialized, a plan bound or captured); the first call and then one at
    most every `every_s` seconds asks for `extend_s` more. A boot that stops making progress stops
    asking, and systemd's start timeout ends it, as it should. STATUS= says what the boot is doing."""

    def __init__(self, notifier: Notifier, extend_s: float = 60.0, every_s: float = 5.0):
        self.notifier, self.extend_s, self.every_s = notifier, extend_s, every_s
        self.last: float | None = None
        self.sent = 0
        self.over = False

    def stage(self, what: str) -> None:
        """A new part of the boot begins: STATUS=booting: `what`, and an extension."""
        self.notifier.status(f"booting: {what}")
        self.last = None
        self.step()

    def done(self) -> None:
        """Boot is over (READY=1 next): later steps (a plan bound at admission) ask for nothing."""
        self.over = True

    def step(self) -> None:
        now = time.monotonic()
        if not self.over and (self.last is None or now - self.last >= self.every_s):
            self.last = now
            self.sent += self.notifier.extend_timeout(self.extend_s)


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """systemd's watchdog timeout (WatchdogSec=) in seconds, or None when none applies to this process.

    As sd_watchdog_enabled(3): $WATCHDOG_USEC is a positive integer, and $WATCHDOG_PID, when set,
    must be this process's pid (otherwise the watchdog belongs to another process: None).
    Ping at half the interval. A malformed value raises ValueError naming the variable.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        if not pid.isdigit() or int(pid) <= 0:
            raise ValueError(f"WATCHDOG_PID={pid!r} is not a pid")
        if int(pid) != os.getpid():
            return None
    if not usec.isdigit() or int(usec) <= 0:
        raise ValueError(f"WATCHDOG_USEC={usec!r} is not a positive number of microseconds")
    return int(usec) / 1e6
