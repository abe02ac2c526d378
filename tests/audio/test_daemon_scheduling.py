"""The daemon's audio threads ask for real-time scheduling at boot (audio.realtime_priority, SCHED_FIFO
5) and say in one log line and in `status` what each got: the speaker's feeder and the listener
raise themselves; PortAudio's output and input callbacks run on the audio server's thread, which
JACK (-R, as on a device) made real-time already, above them: left as it is, and said so. Granted
here (root, CAP_SYS_NICE); refused in a process without CAP_SYS_NICE and without RLIMIT_RTPRIO (no
LimitRTPRIO=) and in a user namespace, where each thread (the callbacks' too: JACK could not raise
them either) names what was refused and why, and the daemon serves as before. `status.audio.input`
reports the listener's lag (`behind_ms`, `behind_max_ms` over 10 s)."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from support.daemon import Daemon

from edged.client import Client

THREADS = ("feeder", "output callback", "listener", "input callback")
DEVICES = '[audio]\ndevice = "system"\ninput_device = "system"\n[events]\nlisten = "none"\n'


def scheduling(status: dict) -> dict:
    audio = status["audio"]
    out, inp = audio["output"]["scheduling"], audio["input"]["scheduling"]
    return {"feeder": out["feeder"], "output callback": out["callback"], "listener": inp["listener"],
            "input callback": inp["callback"]}


def boot_line(log: str) -> str:
    return next(line for line in log.splitlines() if "audio threads (asked: " in line)


def served(daemon: Daemon) -> dict:
    with Client(daemon.endpoint, timeout_s=60) as client:
        done = client.speak("Real time, or not.", max_audio_ms=600).wait()
        assert done.reason == "length" and done.report["played_ms"] == done.report["audio_ms"] > 0, done.report
        return client.status()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CAP_SYS_NICE) to be granted SCHED_FIFO")
def test_granted_every_audio_thread_runs_sched_fifo_and_says_so(jack_server, tmp_path):
    daemon = Daemon(tmp_path, config=DEVICES)
    try:
        status = served(daemon)
        got = scheduling(status)
        own = {"policy": "fifo", "priority": 5, "nice": 0, "why": ""}
        assert got["feeder"] == got["listener"] == own, got
        server = got["output callback"]
        assert got["input callback"] == server and server["policy"] == "fifo" and server["priority"] > 5, got
        assert server["why"] == "the audio server's real-time thread, left as it is", got
        callback = f"fifo {server['priority']} (the audio server's real-time thread, left as it is)"
        assert boot_line(daemon.read_log()).endswith(
            f"audio threads (asked: SCHED_FIFO 5): feeder fifo 5; output callback {callback}; listener fifo 5; "
            f"input callback {callback}")
        inp = status["audio"]["input"]
        assert 0 <= inp["behind_ms"] <= inp["behind_max_ms"] < 1000, inp
        assert daemon.terminate() == 0
    finally:
        daemon.close()


REFUSING = {"no CAP_SYS_NICE": ("setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"),
            "a user namespace": ("unshare", "--user", "--map-root-user")}
"""Where SCHED_FIFO is refused: a process without the capability and without RLIMIT_RTPRIO, and root
in a user namespace (its CAP_SYS_NICE holds only there)."""


@pytest.mark.skipif(shutil.which("setpriv") is None or shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs root, setpriv(1) and unshare(1)")
@pytest.mark.parametrize("where", list(REFUSING))
def test_refused_each_thread_names_why_and_the_daemon_serves(jack_server, tmp_path, where):
    daemon = Daemon(tmp_path, config=DEVICES, wrap=REFUSING[where])
    try:
        got = scheduling(served(daemon))
        for thread in THREADS:
            assert (got[thread]["policy"], got[thread]["nice"]) == ("other", 0), got
            assert re.fullmatch(r"SCHED_FIFO 5 refused: EPERM: RLIMIT_RTPRIO is \d+, it needs 5 \(the unit's "
                                r"LimitRTPRIO=\) or CAP_SYS_NICE; nice -10 refused: EACCES: RLIMIT_NICE is \d+, it "
                                r"needs 30 \(the unit's LimitNICE=\) or CAP_SYS_NICE", got[thread]["why"]), got
        line = boot_line(daemon.read_log())
        assert line.count("SCHED_FIFO 5 refused: EPERM") == 4 and "Traceback" not in daemon.read_log(), line
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_off_the_threads_ask_nothing(jack_server, tmp_path):
    daemon = Daemon(tmp_path, config=DEVICES.replace("[events]", "realtime_priority = 0\n[events]"))
    try:
        got = scheduling(served(daemon))
        assert all(got[t]["why"] == "not asked: audio.realtime_priority = 0" for t in THREADS), got
        assert "audio threads (asked: nothing, audio.realtime_priority = 0): " in boot_line(daemon.read_log())
        assert daemon.terminate() == 0
    finally:
        daemon.close()
