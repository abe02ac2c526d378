"""The daemon's side of systemd: readiness, status and watchdog (sd_notify), and journald logging.

Everything works without systemd-python (the `systemd` extra) and is a no-op outside systemd.
"""

from edged.systemd.logging import JournalHandler, NativeJournalSender, journal_wanted, setup_logging
from edged.systemd.notify import BootProgress, Notifier, watchdog_interval
from edged.systemd.watchdog import Watchdog

__all__ = ["BootProgress", "JournalHandler", "NativeJournalSender", "Notifier", "Watchdog", "journal_wanted", "setup_logging",
           "watchdog_interval"]
