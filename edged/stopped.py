"""After a process that handles SIGTERM and SIGINT has stopped: the signals ignored until it exits."""

from __future__ import annotations

import signal
import threading


def ignore_stop_signals() -> None:
    """What is left is the interpreter's exit, which puts back the default action of a signal Python
    handles, so a repeated SIGTERM or Ctrl-C there would end the process by the signal instead of
    its exit code. Ignored, they change nothing (only the main thread may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
