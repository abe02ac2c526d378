"""Behaviour the README and docs/ document, each through the real daemon (or the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

from edged.client import Client, RequestRejected


def edged(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ)


def test_serve_exits_2_on_a_bad_artifact_naming_it(tmp_path):
    (tmp_path / "edged.toml").write_text('[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n')
    done = edged("serve", "--config", str(tmp_path / "edged.toml"), "--artifact", str(tmp_path / "nowhere"),
                 "--listen", f"ipc://{tmp_path / 'x.sock'}")
    assert done.returncode == 2
    assert "boot failed" in done.stderr and "no artifact.json" in done.stderr


def test_a_second_signal_exits_at_once(start_daemon):
    """The first SIGTERM drains (a 30 s reply would hold it for drain_timeout_s = 60); the second
    leaves without waiting."""
    daemon = start_daemon(config="[daemon]\ndrain_timeout_s = 60\n")
    with Client(daemon.endpoint, timeout_s=60) as client:
        utterance = client.speak("A long reply.", play=False, stream=True, max_audio_ms=30000)
        next(e for e in utterance if type(e).__name__ == "Audio")
        daemon.proc.send_signal(15)
        daemon.wait_for("STOPPING=1", timeout=10)
        assert client.status()["state"] == "draining"
        daemon.proc.send_signal(15)
        assert daemon.proc.wait(timeout=10) == 0


def test_signals_while_it_stops_change_nothing(start_daemon):
    """A drained daemon exits 0 however many signals follow the first: a stop that repeats its
    SIGTERM (a supervisor, a user's second Ctrl-C) while the process tears down is not death by the
    signal. Signals go every 5 ms from the first until the process is gone, across its teardown
    and the interpreter's exit (which puts back the default action of a signal Python handled)."""
    daemon = start_daemon()
    with Client(daemon.endpoint, timeout_s=60) as client:
        utterance = client.speak("A short reply.", play=False, max_audio_ms=800)
        utterance.wait()
    sent = 0
    while daemon.proc.poll() is None:
        daemon.proc.send_signal(15)
        sent += 1
        time.sleep(0.005)
    assert daemon.proc.returncode == 0 and sent >= 2, (daemon.proc.returncode, sent)


def test_say_exit_codes_and_cancel(start_daemon):
    daemon = start_daemon()
    ok = edged("say", "Hello.", "--no-play", "--max-audio-ms", "160", "--endpoint", daemon.endpoint)
    assert ok.returncode == 0 and json.loads(ok.stdout)["reason"] == "length"
    rejected = edged("say", "Hello.", "--no-play", "--voice", "nobody", "--endpoint", daemon.endpoint)
    assert rejected.returncode == 2 and "unknown voice 'nobody'" in rejected.stderr
    cancel = edged("cancel", "nothing-in-flight", "--endpoint", daemon.endpoint)
    assert cancel.returncode == 0 and cancel.stdout == ""


def test_edged_cancel_stops_another_clients_request_by_its_id(start_daemon, tmp_path):
    """`edged cancel ID` ends the request that `edged status` lists (another client's: the CLI's own
    connection has none); with no daemon answering it exits 1."""
    daemon = start_daemon()
    with Client(daemon.endpoint, timeout_s=120) as client:
        utterance = client.speak("A long reply to cancel.", id="long-one", play=False, stream=True,
                                 max_audio_ms=300_000)
        next(e for e in utterance if type(e).__name__ == "Audio")
        assert client.status()["cohort"]["members"] == ["long-one"]
        cancel = edged("cancel", "long-one", "--endpoint", daemon.endpoint)
        assert cancel.returncode == 0 and cancel.stdout == "", cancel.stderr
        done = utterance.wait()
    assert done.reason == "cancelled" and done.report["frames"] < 3750
    gone = edged("cancel", "long-one", "--endpoint", f"ipc://{tmp_path / 'nobody.sock'}", "--timeout", "1")
    assert gone.returncode == 1 and gone.stderr.startswith("edged cancel: "), gone.stderr


def test_a_reply_that_runs_into_the_kv_limit_ends_with_length(start_daemon):
    """The built-in artifact has 512 KV slots: a reply longer than what is left after its prompt
    stops there, with reason length, on the frame the room ran out."""
    daemon = start_daemon()
    with Client(daemon.endpoint, timeout_s=120) as client:
        done = client.speak("Short prompt.", play=False, max_audio_ms=600_000).wait()
    frames = done.report["frames"]
    assert done.reason == "length" and 400 < frames <= 512
    prefill = done.report["stages"][0]["prefill_rows"]
    assert frames == 512 - prefill + 1


def test_max_message_bytes_is_the_limit(start_daemon):
    daemon = start_daemon(config="[daemon]\nmax_message_bytes = 2048\n")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(daemon.endpoint)
    try:
        sock.send(msgpack.packb({"op": "speak", "id": "big", "text": "a" * 3000, "play": False}))
        reply = msgpack.unpackb(sock.recv())
        assert reply["op"] == "error" and reply["reason"].startswith("message too large:") and "(max 2048)" in reply["reason"]
    finally:
        sock.close()
    with Client(daemon.endpoint) as client:
        assert client.speak("Small enough.", play=False, max_audio_ms=160).wait().reason == "length"


def test_log_level_warning_leaves_out_info(start_daemon):
    daemon = start_daemon(config='[daemon]\nlog_level = "warning"\n')
    with Client(daemon.endpoint) as client:
        assert client.speak("Quietly.", play=False, max_audio_ms=160).wait().reason == "length"
        with pytest.raises(RequestRejected):
            client.speak("Hello.", play=False, voice="nobody").wait()
    assert daemon.terminate() == 0
    log = daemon.read_log()
    assert " INFO " not in log and "serving" not in log


def test_nil_fields_and_sampling_keys_take_their_defaults(start_daemon):
    """docs/protocol.md: an optional field absent or nil means its default, and so does a nil
    sampling key: a speak with every other field and sampling key nil makes the frames of the same
    speak without them."""
    from edged import protocol

    daemon = start_daemon()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60000)
    sock.connect(daemon.endpoint)
    plain = {"op": "speak", "text": "Nil is the default.", "max_audio_ms": 400, "report_codes": True,
             "sampling": {"seed": 5}}
    nils = {k: None for k in ("more_text", "session", "voice", "language", "instruct", "play", "stream", "format",
                              "context", "media")}
    sampling = {**dict.fromkeys(protocol.SAMPLING_KEYS), "seed": 5}
    try:
        codes = []
        for id, header in (("plain", plain), ("nils", {**plain, **nils, "sampling": sampling})):
            sock.send(msgpack.packb({**header, "id": id}))
            replies = []
            while not replies or replies[-1]["op"] not in ("done", "error", "rejected"):
                replies.append(msgpack.unpackb(sock.recv()))
            assert [r["op"] for r in replies] == ["accepted", "done"], replies
            codes.append(replies[-1]["report"]["rvq_codes"])
        assert codes[0] == codes[1] and len(codes[0]) == 5
    finally:
        sock.close()


def test_edged_history_shows_and_adds_turns(start_daemon):
    """`edged history SESSION [--add ROLE TEXT] [--wait] [--json]` beside `edged say --session`."""
    daemon = start_daemon()
    added = edged("history", "kitchen", "--add", "user", "What's the weather?", "--endpoint", daemon.endpoint)
    assert added.returncode == 0 and added.stdout == "user: What's the weather?\n", added.stderr
    said = edged("say", "It is sunny.", "--session", "kitchen", "--no-play", "--max-audio-ms", "160",
                 "--endpoint", daemon.endpoint)
    assert said.returncode == 0, said.stderr
    shown = edged("history", "kitchen", "--wait", "--json", "--endpoint", daemon.endpoint)
    turns = json.loads(shown.stdout)
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[0]["content"] == "What's the weather?"
    assert "It is sunny.".startswith(turns[1]["content"]) and turns[1]["interrupted"] is True  # cut by max_audio_ms
    bad = edged("history", "kitchen", "--add", "bot", "hi", "--endpoint", daemon.endpoint)
    assert bad.returncode == 1 and "role must be one of 'user', 'system', 'assistant'" in bad.stderr
