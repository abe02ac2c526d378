"""systemd lifecycle of the real daemon, seen through a NOTIFY_SOCKET the test binds.

1. READY=1 only after boot (preallocation, warm-up and bind), then STATUS= lines
2. WATCHDOG=1 while serving; the pings stop when the cohort loop stalls
3. SIGTERM: STOPPING=1, in-flight requests finish (each gets its `done`), the backend is closed, exit 0
4. SIGTERM with a short drain deadline: the rest are cancelled, each still gets its `done`, exit 0
"""

from __future__ import annotations

import time

from edged.client import Client

WATCHDOG_USEC = 2_000_000  # pings every 1 s, stall threshold 1 s


def test_ready_then_status(start_daemon):
    daemon = start_daemon()
    boot = daemon.messages[:daemon.messages.index("READY=1")]  # what the boot said, then READY=1
    assert all(m.startswith(("STATUS=booting: ", "EXTEND_TIMEOUT_USEC=")) for m in boot), boot
    with Client(daemon.endpoint) as client:  # bound before READY=1: the first request just works
        assert client.speak("Ready means ready.", play=False, max_audio_ms=160).wait().reason == "length"
    daemon.receive(1.5)
    assert any(m.startswith("STATUS=serving on ") for m in daemon.messages)


def test_watchdog_pings_while_serving_and_stop_when_the_loop_stalls(start_daemon):
    daemon = start_daemon(config="[daemon]\ntest_stall_after_steps = 10\n", watchdog_usec=WATCHDOG_USEC)
    assert "WATCHDOG=1" in daemon.receive(2.5)
    with Client(daemon.endpoint) as client:
        client.speak("This request stalls the loop.", play=False, max_audio_ms=4000).next_event()
    deadline = time.monotonic() + 30
    while "the loop hangs now" not in daemon.read_log():
        assert time.monotonic() < deadline, daemon.read_log()
        time.sleep(0.1)
    daemon.receive(1.2)  # a ping already under way may still arrive
    assert "WATCHDOG=1" not in daemon.receive(3.0), "pings must stop while the loop is stuck"
    assert daemon.proc.poll() is None


def test_sigterm_drains_in_flight_requests_then_exits_0(start_daemon):
    daemon = start_daemon()
    with Client(daemon.endpoint, timeout_s=60) as client:
        utterances = [client.speak(f"In flight {i}.", play=False, stream=True, max_audio_ms=2400) for i in range(3)]
        next(e for e in utterances[0] if type(e).__name__ == "Audio")
        daemon.proc.send_signal(15)
        dones = [u.wait() for u in utterances]
    assert [d.reason for d in dones] == ["length"] * 3
    assert daemon.proc.wait(timeout=30) == 0
    daemon.receive(0.5)
    assert "STOPPING=1" in daemon.messages
    log = daemon.read_log()
    assert log.index("closed the onnxruntime backend") < log.index("INFO    edged.daemon: stopped")


def test_drain_deadline_cancels_the_rest(start_daemon):
    daemon = start_daemon(config="[daemon]\ndrain_timeout_s = 0.3\n")
    with Client(daemon.endpoint, timeout_s=60) as client:
        utterances = [client.speak(f"Very long {i}.", play=False, stream=True, max_audio_ms=30000) for i in range(6)]
        next(e for e in utterances[0] if type(e).__name__ == "Audio")
        daemon.proc.send_signal(15)
        dones = [u.wait() for u in utterances]
    assert {d.reason for d in dones} == {"cancelled"}
    assert all(d.report["frames"] < 375 for d in dones)
    assert daemon.proc.wait(timeout=30) == 0
