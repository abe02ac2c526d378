"""Feed systemd's watchdog only while the cohort loop makes progress.

The loop calls `progress()` once per iteration (it stores a timestamp, nothing else). A small
thread wakes every `ping_every_s` and sends WATCHDOG=1 only if the last `progress()` is at most
`stall_after_s` old. A loop stuck in an engine call or a deadlock therefore stops the pings, and
systemd (WatchdogSec=) kills the service with WatchdogSignal= and restarts it.

The loop must iterate even when idle: wait for work with a timeout well under `stall_after_s`.

Timing, with W = WatchdogSec, pings every W/2 and the default stall_after_s = W/2: a loop stuck
since t is killed between t + W and t + 1.5 W, so W reads as "the longest stall tolerated".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edged.systemd.notify import Notifier, watchdog_interval

log = logging.getLogger("edged.systemd")


class Watchdog:
    """WATCHDOG=1 every `ping_every_s` while `progress()` is fresh; disabled without a watchdog interval.

    interval_s: systemd's watchdog timeout in seconds; default: from $WATCHDOG_USEC (None = no
      watchdog configured, and start() does nothing).
    ping_every_s: default interval_s / 2, as sd_watchdog_enabled(3) advises.
    stall_after_s: how old the last progress() may be for a ping to go out; default interval_s / 2.
    clock: the monotonic clock (tests pass a fake one and call tick() themselves).
    """

    def __init__(self, notifier: Notifier, interval_s: float | None = None, *,
                 ping_every_s: float | None = None, stall_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.notifier = notifier
        self.interval_s = watchdog_interval() if interval_s is None else interval_s
        half = self.interval_s / 2 if self.interval_s is not None else 0.0
        self.ping_every_s = ping_every_s if ping_every_s is not None else half
        self.stall_after_s = stall_after_s if stall_after_s is not None else half
        self.clock = clock
        self.last_progress = clock()
        self.stalled = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None and self.notifier.enabled

    def progress(self) -> None:
        """The loop went round once. Cheap: one clock read and one store, no lock."""
        self.last_progress = self.clock()

    def tick(self) -> bool:
        """One pinger round: WATCHDOG=1 if progress() is fresh. Returns whether a ping was sent."""
        age = self.clock() - self.last_progress
        if age > self.stall_after_s:
            if not self.stalled:
                log.error("cohort loop made no progress for %.1f s: withholding WATCHDOG=1, systemd will restart "
                          "edged", age, extra={"reason": "watchdog_stall"})
            self.stalled = True
            return False
        if self.stalled:
            log.warning("cohort loop progresses again: resuming WATCHDOG=1", extra={"reason": "watchdog_resume"})
        self.stalled = False
        return self.notifier.watchdog()

    def start(self) -> Watchdog:
        """Starts the pinger thread (a no-op when disabled). Counts from now: call it after READY=1."""
        if not self.enabled or self._thread is not None:
            return self
        self.last_progress = self.clock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edged-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the pinger thread; safe to call twice, or without start()."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.ping_every_s):
                return
