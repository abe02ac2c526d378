"""Loading PortAudio (through sounddevice), naming devices, and rescanning them without hanging.

PortAudio lists devices once, when it initializes; a device that appears later (a USB speaker
plugged in, an audio server restarted) is seen only after a terminate + initialize. A stream whose
device died can hang PortAudio calls, so the rescan runs on a helper thread with a deadline.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("edged.audio")

_helpers: list[threading.Thread] = []
"""Threads still inside PortAudio (closing a stream, rescanning): no rescan starts while one runs."""


def _helper(target: Any, name: str, timeout: float) -> bool:
    """Run `target` on a daemon thread; True if it returned within `timeout` seconds."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    _helpers.append(thread)
    thread.start()
    thread.join(timeout)
    _helpers[:] = [t for t in _helpers if t.is_alive()]
    return not thread.is_alive()


def sounddevice() -> Any:
    """sounddevice, loaded on first use. A JACK server is never started as a side effect."""
    os.environ.setdefault("JACK_NO_START_SERVER", "1")
    import sounddevice as sd

    return sd


def missing() -> str | None:
    """Why there is no PortAudio to use, in one line; None when it loads. sounddevice's import raises
    OSError when the library cannot be found or loaded (Debian's libportaudio2 not installed)."""
    try:
        sounddevice()
    except OSError as exc:
        return (f"no PortAudio library: install libportaudio2 (Debian/Ubuntu) or your system's PortAudio package "
                f"and restart: no speaker and no microphone ({exc})")
    return None


def device_arg(name: str) -> int | str | None:
    """Config value -> sounddevice's `device` argument: "" the default, digits an index, else a name."""
    if name == "":
        return None
    return int(name) if name.isdigit() else name


def open_error(kind: str, name: str, exc: Exception) -> str:
    """Why a stream could not open, in words (PortAudio says "Error querying device -1" when there
    is no default device at all)."""
    if name == "" and "device -1" in str(exc):
        return f"no {kind} device: PortAudio lists no default {kind} device"
    return f"cannot open {kind} device {name or '(default)'}: {exc}"


def rescan(timeout: float = 3.0) -> bool:
    """Terminate and re-initialize PortAudio (every stream must be closed first). False when
    PortAudio did not come back within `timeout` seconds, or an earlier close or rescan is still
    stuck inside it; the caller is never blocked longer."""
    sd = sounddevice()
    errors: list[BaseException] = []
    _helpers[:] = [t for t in _helpers if t.is_alive()]
    if _helpers:
        log.warning("PortAudio rescan postponed: %s still inside PortAudio", ", ".join(t.name for t in _helpers))
        return False

    def run() -> None:
        try:
            sd._terminate()
            sd._initialize()
        except Exception as exc:
            errors.append(exc)

    if not _helper(run, "edged-audio-rescan", timeout):
        log.error("PortAudio did not re-initialize within %.1f s", timeout)
        return False
    if errors:
        log.error("PortAudio re-initialize failed: %s", errors[0])
        return False
    return True


def stuck() -> bool:
    """Whether a close or rescan is still inside PortAudio (exiting normally would hang in it)."""
    return any(t.is_alive() for t in _helpers)


def close_stream(stream: Any, what: str, timeout: float = 2.0) -> bool:
    """Abort and close a stream on a helper thread; False if PortAudio did not return within
    `timeout` seconds (a dead device can hang it). The caller is never blocked longer."""

    def shut() -> None:
        try:
            stream.abort()
            stream.close()
        except Exception:
            log.exception("closing the %s stream failed", what)

    if not _helper(shut, f"edged-close-{what}", timeout):
        log.error("the %s stream did not close within %.1f s; abandoning it", what, timeout)
        return False
    return True
