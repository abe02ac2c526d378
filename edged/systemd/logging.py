"""Logging: journald with structured fields under systemd, a readable line on stderr otherwise.

Under systemd (stderr is the journal stream named by $JOURNAL_STREAM, or $INVOCATION_ID is set)
and with journald's socket present, every record becomes one journal entry with these fields:

    MESSAGE            the formatted message, with the traceback when the record has one
    PRIORITY           syslog priority: DEBUG 7, INFO 6, WARNING 4, ERROR 3, CRITICAL 2
    SYSLOG_IDENTIFIER  "edged"
    LOGGER             the logger's name, e.g. edged.daemon
    THREAD_NAME        the Python thread, e.g. MainThread, edged-watchdog
    CODE_FILE, CODE_LINE, CODE_FUNC   where the record was logged
    <EXTRA>            each key of `extra={...}`, upper-cased: request_id -> REQUEST_ID,
                       reason -> REASON, session -> SESSION, client -> CLIENT

so `journalctl -u edged REQUEST_ID=r17` shows one request's story and `-o json` every field.
Characters a journal field name may not hold become "_". Elsewhere the same record reads
`2025-01-01 12:00:00,000 INFO    edged.daemon: message [request_id=r17 reason=eos]`.

Entries reach journald through systemd-python's sd_journal_sendv (the `systemd` extra) or, without
it, through `NativeJournalSender`, the native protocol in pure Python. (systemd-python's own
JournalHandler is not used: it passes every record attribute through verbatim, and journald drops
lower-case field names, so `extra={"request_id": ...}` would never arrive.)
"""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

IDENTIFIER = "edged"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
STDERR_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

Target = Literal["auto", "journal", "stderr"]
Fields = list[tuple[str, str]]
Sender = Callable[[Fields], None]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# Extras that only restyle the message for a terminal: uvicorn's `color_message` (ANSI colour codes)
_PRESENTATION = {"color_message"}
_INVALID = re.compile(r"[^A-Z0-9_]")
_installed: logging.Handler | None = None  # what setup_logging() added to the root logger


def record_extras(record: logging.LogRecord) -> dict[str, object]:
    """The record's `extra={...}` items, in the order they were given."""
    return {k: v for k, v in record.__dict__.items()
            if k not in _STANDARD and k not in _PRESENTATION and not k.startswith("_")}


def field_name(key: str) -> str:
    """request_id -> REQUEST_ID: upper case, A-Z 0-9 _ only, not starting with _ or a digit, <= 64 chars."""
    name = _INVALID.sub("_", key.upper()).lstrip("_0123456789")
    return (name or "EXTRA")[:64]


def _priority(levelno: int) -> int:
    for limit, priority in ((logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4), (logging.ERROR, 3)):
        if levelno <= limit:
            return priority
    return 2


# --------------------------------------------------------------------------------------- senders


def _encode(fields: Iterable[tuple[str, str]]) -> bytes:
    """The native protocol: KEY=value\\n, or, for a value with a newline, KEY\\n <u64 le length> value\\n."""
    out = bytearray()
    for key, value in fields:
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class NativeJournalSender:
    """Sends entries to journald's native socket without systemd-python.

    One datagram per entry; an entry too big for a datagram goes as a sealed memfd passed over
    the socket, as sd_journal_sendv does.
    """

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def __call__(self, fields: Fields) -> None:
        data = _encode(fields)
        try:
            self.sock.sendto(data, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> None:
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            self.sock.sendmsg([], rights, 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.sock.close()


def _systemd_python_sender() -> Sender | None:
    try:
        import systemd.journal  # systemd-python: the `systemd` extra
    except ImportError:
        return None

    def send(fields: Fields) -> None:
        systemd.journal.sendv(*(f"{key}={value}" for key, value in fields))

    return send


def journal_sender(backend: Literal["auto", "systemd", "socket"] = "auto") -> Sender:
    """systemd-python's sd_journal_sendv when importable (or backend="systemd"), else NativeJournalSender."""
    sender = None if backend == "socket" else _systemd_python_sender()
    if backend == "systemd" and sender is None:
        raise ImportError("journal backend 'systemd' needs systemd-python (it builds against libsystemd-dev; "
                          "`make install-dev` and `sudo make install-system` install both)")
    return sender or NativeJournalSender()


# --------------------------------------------------------------------------------------- handlers


class JournalHandler(logging.Handler):
    """One journal entry per record, with the fields in this module's docstring."""

    def __init__(self, sender: Sender | None = None, identifier: str = IDENTIFIER, level: int = logging.NOTSET):
        super().__init__(level)
        self.sender = sender or journal_sender()
        self.identifier = identifier

    def fields(self, record: logging.LogRecord) -> Fields:
        fields = [
            ("MESSAGE", self.format(record)),
            ("PRIORITY", str(_priority(record.levelno))),
            ("SYSLOG_IDENTIFIER", self.identifier),
            ("LOGGER", record.name),
            ("THREAD_NAME", str(record.threadName)),
            ("CODE_FILE", record.pathname),
            ("CODE_LINE", str(record.lineno)),
            ("CODE_FUNC", record.funcName),
        ]
        fields += [(field_name(k), str(v)) for k, v in record_extras(record).items()]
        return fields

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sender(self.fields(record))
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if isinstance(self.sender, NativeJournalSender):
            self.sender.close()
        super().close()


class StderrFormatter(logging.Formatter):
    """STDERR_FORMAT, then the extras: `... message [request_id=r17 reason=eos]`."""

    def __init__(self) -> None:
        super().__init__(STDERR_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = record_extras(record)
        if not extras:
            return line
        tail = " [" + " ".join(f"{k}={v}" for k, v in extras.items()) + "]"
        head, newline, traceback = line.partition("\n")
        return head + tail + newline + traceback


# --------------------------------------------------------------------------------------- setup


def journal_wanted(environ: Mapping[str, str] | None = None, stderr_fd: int = 2) -> bool:
    """True under systemd: stderr is $JOURNAL_STREAM (device:inode of the journal's stream), or
    $INVOCATION_ID is set (a systemd unit whose stderr goes elsewhere)."""
    env = os.environ if environ is None else environ
    stream = env.get("JOURNAL_STREAM")
    if stream:
        try:
            st = os.fstat(stderr_fd)
        except OSError:
            pass
        else:
            if stream == f"{st.st_dev}:{st.st_ino}":
                return True
    return bool(env.get("INVOCATION_ID"))


def setup_logging(level: str | int = "info", target: Target = "auto",
                  journal_backend: Literal["auto", "systemd", "socket"] = "auto") -> logging.Handler:
    """Points the root logger at the journal or stderr and sets its level ("debug", "INFO", 20...).

    target "auto": the journal when `journal_wanted()` and its socket exists, else stderr.
    Calling it again replaces the handler it installed before. Returns the handler.
    """
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())  # the number, or "Level LOUD" for an unknown name
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        level = number
    if target == "auto":
        target = "journal" if journal_wanted() and os.path.exists(JOURNAL_SOCKET) else "stderr"
    handler: logging.Handler
    if target == "journal":
        handler = JournalHandler(journal_sender(journal_backend))
    elif target == "stderr":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(StderrFormatter())
    else:
        raise ValueError(f"unknown log target {target!r}")
    global _installed
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
        _installed.close()
    root.addHandler(handler)
    _installed = handler
    root.setLevel(level)
    return handler
