"""Clients that misbehave or vanish never block the loop or hold a cohort slot: the real daemon, real
sockets, a client process killed with SIGKILL, a client that never reads."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import msgpack
import zmq

from edged.client import Client

CHUNK_1 = "[daemon]\nclient_queue = 32\n[vocoder]\nchunk_frames = 1\n"  # a reader's backlog fills fast
LONG = "A long reply that keeps the cohort busy for a good while, " * 4


def ended(client: Client, id: str, timeout: float = 60) -> dict:
    """Wait until the daemon has accepted request `id` (its first) and it has left the cohort and the
    queue; the status then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = client.status()
        if s["counters"]["accepted"] >= 1 and id not in s["cohort"]["members"] and s["queue"]["waiting"] == 0:
            return s
        time.sleep(0.05)
    raise TimeoutError(f"{id} was not accepted, or did not leave the cohort, within {timeout} s")


def speak_header(id: str, **fields) -> bytes:
    return msgpack.packb({"op": "speak", "id": id, "text": LONG, "play": False, "stream": True,
                          "max_audio_ms": 60000, **fields})


def test_a_client_that_stops_reading_loses_its_request_and_the_others_are_served(start_daemon):
    daemon = start_daemon(config=CHUNK_1)
    slow = zmq.Context.instance().socket(zmq.DEALER)
    slow.setsockopt(zmq.RCVHWM, 4)  # it reads nothing: its queue and the daemon's fill up
    slow.setsockopt(zmq.LINGER, 0)
    slow.connect(daemon.endpoint)
    try:
        slow.send(speak_header("slow"))
        with Client(daemon.endpoint, timeout_s=60) as client:
            s = ended(client, "slow")
            assert s["counters"]["done"]["error"] == 1
            done = client.speak("Still served.", play=False, stream=True, max_audio_ms=400).wait()
            assert done.reason == "length"
        log = daemon.read_log()
        assert "request ended: client not reading" in log and "undeliverable audio for 'slow'" in log
    finally:
        slow.close(linger=0)


VANISHING = """
import sys, zmq, msgpack
s = zmq.Context.instance().socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send(msgpack.packb({"op": "speak", "id": "gone", "text": sys.argv[2], "play": False, "stream": True,
                      "max_audio_ms": 60000}))
while msgpack.unpackb(s.recv_multipart()[0]).get("op") != "audio":
    pass
print("streaming", flush=True)
sys.stdin.read()  # killed here
"""


def test_a_client_killed_mid_reply_frees_its_slot(start_daemon):
    daemon = start_daemon(config=CHUNK_1)
    proc = subprocess.Popen([sys.executable, "-c", VANISHING, daemon.endpoint, LONG], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "streaming\n"
        with Client(daemon.endpoint, timeout_s=60) as client:
            assert "gone" in client.status()["cohort"]["members"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            s = ended(client, "gone")
            assert s["counters"]["done"]["error"] == 1 and s["counters"]["done"]["length"] == 0
            assert client.speak("Still served.", play=False, stream=True, max_audio_ms=400).wait().reason == "length"
        assert "request ended: client gone" in daemon.read_log()
    finally:
        proc.kill()
        proc.wait()
