"""Real-time scheduling for the threads that keep audio time: the speaker's feeder, the listener (its
echo canceller and VAD) and PortAudio's two callbacks.

Each asks for itself, from the thread (Linux schedules threads: `sched_setscheduler(0, ...)` and
`setpriority(PRIO_PROCESS, tid, ...)` change the calling thread only), first SCHED_FIFO at
`audio.realtime_priority` (with SCHED_RESET_ON_FORK, so nothing the daemon starts inherits it), and
when that is refused a raised priority (nice FALLBACK_NICE); when that is refused too, the thread
runs as it was and `why` says what was refused and why. A callback thread the audio server already
made real-time (JACK's, when jackd runs with -R) is left as it is. Generation stays at normal
priority: these threads sleep between blocks (a 10 ms block of canceller and VAD, a ring refill),
so real time for them takes from generation only what they use.

What is allowed: SCHED_FIFO up to RLIMIT_RTPRIO (the unit's LimitRTPRIO=) or with CAP_SYS_NICE; nice
below 0 down to 20 - RLIMIT_NICE (the unit's LimitNICE=) or with CAP_SYS_NICE. Under a kernel with
RT group scheduling (CONFIG_RT_GROUP_SCHED) a cgroup without a real-time budget refuses SCHED_FIFO
with EPERM too. `Granted` is what a thread got; `status.audio.threads` shows each.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from dataclasses import dataclass

FALLBACK_NICE = -10
REAL_TIME = {getattr(os, "SCHED_FIFO", -1): "fifo", getattr(os, "SCHED_RR", -1): "rr"}


@dataclass(frozen=True)
class Granted:
    """What one thread runs with, and why not more when it asked for more."""

    policy: str
    """fifo | rr | other"""
    priority: int
    """The real-time priority (0 for other)."""
    nice: int
    why: str = ""
    """Empty when it got what it asked; else what was refused and why."""

    def line(self) -> str:
        got = f"{self.policy} {self.priority}" if self.policy != "other" else f"nice {self.nice}"
        return got + (f" ({self.why})" if self.why else "")

    def to_json(self) -> dict:
        return {"policy": self.policy, "priority": self.priority, "nice": self.nice, "why": self.why}


def audio_threads(speaker, listener) -> dict[str, Granted | None]:
    """Each audio thread of a speaker and a listener (either may be None) and what it runs with."""
    threads: dict[str, Granted | None] = {}
    if speaker is not None:
        playback = speaker.playback
        threads["feeder"] = speaker.scheduling
        threads["output callback"] = playback.scheduling if playback is not None else None
    if listener is not None:
        mic = listener.mic
        threads["listener"] = listener.scheduling
        threads["input callback"] = mic.scheduling if mic is not None else None
    return threads


def as_json(granted: Granted | None) -> dict | None:
    """A thread's scheduling for `status`; None: the thread has not run yet."""
    return granted.to_json() if granted is not None else None


def current() -> Granted:
    """The calling thread's scheduling as it is."""
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    priority = os.sched_getparam(0).sched_priority
    return Granted(REAL_TIME.get(policy, "other"), priority, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))


def raise_this_thread(priority: int, *, keep_real_time: bool = False) -> Granted:
    """SCHED_FIFO at `priority` for the calling thread, else nice FALLBACK_NICE, else as it is (with
    why). `priority` 0: ask nothing (audio.realtime_priority = 0). `keep_real_time`: a thread that is
    already real-time (an audio server's callback thread) is left as it is."""
    now = current()
    if priority <= 0:
        return Granted(now.policy, now.priority, now.nice, "not asked: audio.realtime_priority = 0")
    if keep_real_time and now.policy != "other":  # one audio server thread may run both callbacks: asked already
        asked = now.policy == "fifo" and now.priority == priority
        return Granted(now.policy, now.priority, now.nice, "" if asked else "the audio server's real-time thread, "
                                                                             "left as it is")
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
        return current()
    except OSError as exc:
        refused = f"SCHED_FIFO {priority} refused: {_reason(exc, 'RLIMIT_RTPRIO', priority)}"
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FALLBACK_NICE)
        return Granted("other", 0, FALLBACK_NICE, refused)
    except OSError as exc:
        return Granted("other", 0, now.nice, f"{refused}; nice {FALLBACK_NICE} refused: "
                                            f"{_reason(exc, 'RLIMIT_NICE', 20 - FALLBACK_NICE)}")


def _reason(exc: OSError, limit: str, needed: int) -> str:
    if exc.errno not in (errno.EPERM, errno.EACCES):  # sched_setscheduler says EPERM, setpriority EACCES
        return f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror})"
    soft, _ = resource.getrlimit(getattr(resource, limit))
    unit = "LimitRTPRIO" if limit == "RLIMIT_RTPRIO" else "LimitNICE"
    return (f"{errno.errorcode[exc.errno]}: {limit} is {soft}, it needs {needed} (the unit's {unit}=) or CAP_SYS_NICE"
            + ("; or the cgroup has no real-time budget" if limit == "RLIMIT_RTPRIO" and soft >= needed else ""))
