"""The audio threads' request for real-time scheduling (edged/audio/scheduling.py), from a thread of
its own as the daemon's threads make it: granted here (the tests run as root, with CAP_SYS_NICE),
refused where the process has neither CAP_SYS_NICE nor RLIMIT_RTPRIO / RLIMIT_NICE (the bounding set
without CAP_SYS_NICE: what a service without the unit's LimitRTPRIO= gets), which gives the named
reason, never an exception; off when audio.realtime_priority = 0; a thread that is real-time already
(an audio server's callback thread) is left as it is."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading

import pytest

from edged.audio.scheduling import current, raise_this_thread

ASK = """
import json, threading, sys
from edged.audio.scheduling import raise_this_thread
got = {}
thread = threading.Thread(target=lambda: got.update(raise_this_thread(int(sys.argv[1])).to_json()))
thread.start(); thread.join()
print(json.dumps(got))
"""


def asked(priority: int, *wrap: str) -> dict:
    done = subprocess.run([*wrap, sys.executable, "-c", ASK, str(priority)], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def can_sched_fifo() -> bool:
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_RTPRIO)[0] >= 5


@pytest.mark.skipif(not can_sched_fifo(), reason="needs root or RLIMIT_RTPRIO >= 5")
def test_granted_the_thread_runs_sched_fifo_and_nothing_it_starts_inherits_it():
    assert asked(5) == {"policy": "fifo", "priority": 5, "nice": 0, "why": ""}
    got: dict = {}

    def fork_after():
        raise_this_thread(5)
        child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True)
        got["child"] = int(child.stdout)

    thread = threading.Thread(target=fork_after)
    thread.start()
    thread.join()
    assert got["child"] == os.SCHED_OTHER  # SCHED_RESET_ON_FORK
    assert current().policy == "other"  # the asking thread only: this one is as it was


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv(1)")
def test_refused_it_says_what_and_why_and_the_thread_runs_as_before():
    drop = ("setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice")
    got = asked(5, *drop)
    rtprio = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
    assert got["policy"] == "other" and got["priority"] == 0 and got["nice"] == 0, got
    assert got["why"].startswith(f"SCHED_FIFO 5 refused: EPERM: RLIMIT_RTPRIO is {rtprio}, it needs 5 (the unit's "
                                 f"LimitRTPRIO=) or CAP_SYS_NICE; nice -10 refused: "), got
    assert "RLIMIT_NICE is " in got["why"] and "it needs 30 (the unit's LimitNICE=) or CAP_SYS_NICE" in got["why"]


def test_off_asks_nothing_and_a_real_time_thread_is_kept():
    got = asked(0)
    assert got["why"] == "not asked: audio.realtime_priority = 0" and got["policy"] == "other"
    if can_sched_fifo():
        out: dict = {}

        def server_thread():  # stands in for JACK's real-time client thread
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(9))
            out["g"] = raise_this_thread(5, keep_real_time=True)

        thread = threading.Thread(target=server_thread)
        thread.start()
        thread.join()
        assert (out["g"].policy, out["g"].priority) == ("fifo", 9)
        assert out["g"].why == "the audio server's real-time thread, left as it is"
