"""Audio devices that are not there: the daemon boots and serves anyway, says so in `status`,
treats `play: true` as configured (silent or rejected), and opens the device once it appears
(a JACK server started after the daemon), retrying with backoff."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest
from support import jackd as jack_servers
from support.daemon import Daemon
from support.patchbay import Subscriber

from edged.client import Client, RequestRejected

TEXT = "Hello there, this is a test of the speaker, and it goes on for a while."
FAST_RETRY = "lost_after_ms = 1000\nreopen_min_ms = 200\nreopen_max_ms = 800\n"


@pytest.fixture
def no_server(monkeypatch):
    """A JACK server name nobody runs yet (and no sound card on the test machine)."""
    name = f"edged-later-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("JACK_DEFAULT_SERVER", name)
    monkeypatch.setenv("JACK_NO_START_SERVER", "1")
    return name


def test_missing_device_then_it_appears(tmp_path, no_server):
    if shutil.which("jackd") is None:
        pytest.skip("jackd is not installed")
    # "system": the JACK server's device, by name, so a sound card of the test machine is never used
    events = f"ipc://{tmp_path / 'events.sock'}"
    daemon = Daemon(tmp_path, config=f'[events]\nlisten = "{events}"\n[audio]\ndevice = "system"\n'
                                     f'input_device = "system"\n{FAST_RETRY}')
    jackd = None
    sub = Subscriber(events)
    try:
        with Client(daemon.endpoint) as client:
            out = client.status()["audio"]["output"]
            assert out["state"] == "none" and "cannot open output device system" in out["error"]
            done = client.speak(TEXT, max_audio_ms=500).wait()  # on_missing_device = "silent"
            assert done.reason == "length"
            assert done.report["played_ms"] == 0 and done.report["playback"] == "no output device"

            jackd = jack_servers.start(no_server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while client.status()["audio"]["output"]["state"] != "open":
                assert time.monotonic() < deadline, client.status()["audio"]
                time.sleep(0.2)
            status = client.status()["audio"]
            assert status["output"]["opened"] == 1 and status["output"]["device"] == "system"
            done = client.speak(TEXT, max_audio_ms=1000).wait()
            assert done.reason == "length" and done.report["played_ms"] == done.report["audio_ms"] > 0
            deadline = time.monotonic() + 10  # the microphone follows the speaker's rescan
            while client.status()["audio"]["input"]["state"] != "open":
                assert time.monotonic() < deadline, client.status()["audio"]
                time.sleep(0.2)
            time.sleep(0.3)  # the event socket's last messages
            opened = [(e["stream"], e["state"], e["device"]) for e in sub.of("device")]
            assert opened == [("output", "open", "system"), ("input", "open", "system")], sub.of("device")
        assert daemon.terminate() == 0
    finally:
        sub.close()
        daemon.close()
        if jackd is not None:
            jackd.terminate()
            jackd.wait(10)


def test_reject_policy_names_the_missing_device(tmp_path, no_server):
    daemon = Daemon(tmp_path, config='[events]\nlisten = "none"\n[audio]\non_missing_device = "reject"\n'
                                     'device = "no-such-speaker"\ninput_device = "none"\n')
    try:
        with Client(daemon.endpoint) as client:
            out = client.status()["audio"]
            assert out["output"]["state"] == "none" and "no-such-speaker" in out["output"]["error"]
            assert out["input"] == {"state": "off"}
            with pytest.raises(RequestRejected, match="no audio device for play: true"):
                client.speak(TEXT, max_audio_ms=500).wait()
            done = client.speak(TEXT, max_audio_ms=500, play=False, stream=True).wait()
            assert done.reason == "length" and "played_ms" not in done.report
        assert daemon.terminate() == 0
    finally:
        daemon.close()


def test_a_stalled_device_ends_the_reply_and_the_daemon_keeps_serving(tmp_path, no_server):
    """The audio server stops (SIGSTOP: no more callbacks, and PortAudio calls into it hang) in the
    middle of a reply. The reply ends with an error naming the loss and the `played_ms` heard so far;
    closing the dead streams is abandoned, never waited on; the daemon serves on and exits 0.

    (Resuming a stopped JACK server is not part of this test: PortAudio's JACK host API then fails an
    assertion in its callback and aborts the process; systemd's Restart= covers that.)"""
    if shutil.which("jackd") is None:
        pytest.skip("jackd is not installed")
    jackd = jack_servers.start(no_server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = sub = None
    try:
        time.sleep(1.0)
        events = f"ipc://{tmp_path / 'events.sock'}"
        daemon = Daemon(tmp_path, config=f'[events]\nlisten = "{events}"\n[audio]\ndevice = "system"\n'
                                         f'input_device = "system"\n{FAST_RETRY}')
        sub = Subscriber(events)
        with Client(daemon.endpoint) as client:
            assert client.status()["audio"]["output"]["state"] == "open"
            utt = client.speak(TEXT, max_audio_ms=4000)
            time.sleep(1.0)
            jackd.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            done = utt.wait()
            assert done.reason == "error" and done.error.startswith("audio device lost: system stopped calling back")
            assert time.monotonic() - stopped < 1.0 + 2.0  # lost_after_ms, and the feeder's tick
            assert 500 < done.report["played_ms"] < 1500
            out = client.status()["audio"]["output"]
            assert out["state"] == "lost" and out["lost"] == 1 and out["error"].startswith("audio device lost"), out
            lost = [(e["stream"], e["state"], e["device"]) for e in sub.of("device") if e["state"] == "lost"]
            assert ("output", "lost", "system") in lost, sub.of("device")
            free = client.speak(TEXT, max_audio_ms=500, play=False, stream=True).wait()
            assert free.reason == "length"
        assert daemon.terminate(timeout=20) == 0
        assert "stuck in PortAudio; exiting without it" in daemon.read_log()
    finally:
        if sub is not None:
            sub.close()
        if daemon is not None:
            daemon.close()
        jackd.send_signal(signal.SIGCONT)  # let it end itself: a killed server leaves its shared memory
        jackd.terminate()                  # behind (support/jackd.py clears such leftovers at the next session)
        try:
            jackd.wait(10)
        except subprocess.TimeoutExpired:
            jackd.kill()
            jackd.wait(10)
