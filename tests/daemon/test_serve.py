"""The real daemon over the real protocol: lifecycle scenarios.

1. a streamed request gets `accepted`, contiguous `audio` chunks, then exactly one `done`
2. 32 concurrent requests from 4 clients (ipc:// and tcp://127.0.0.1) each get exactly one `done`
3. a cancel ends a reply within one chunk of the audio the client had received when it sent it
4. a request admitted while others are mid-utterance starts (and ends) before they end
5. malformed and oversized messages get `error`, and the daemon keeps serving
6. admission rejects for free: unknown voice or language, bad sampling, too long, duplicate id, busy
"""

from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from support.doors import free_port

from edged import protocol
from edged.client import Client, RequestRejected


def test_stream_then_exactly_one_done(shared_daemon):
    with Client(shared_daemon.endpoint) as client:
        utterance = client.speak("Streaming back to the client.", voice="vivian", play=False, stream=True,
                                 max_audio_ms=1200, report_codes=True)
        events = list(utterance)
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "Accepted" and kinds[-1] == "Done" and kinds.count("Done") == 1
    audio = [e for e in events if type(e).__name__ == "Audio"]
    assert [a.seq for a in audio] == list(range(len(audio))) and len(audio) >= 2
    done = events[-1]
    assert done.reason == "length" and done.report["frames"] == 15
    assert sum(a.samples for a in audio) == 15 * 1920 == utterance.pcm.shape[0]
    assert done.report["audio_ms"] == 1200.0 and done.report["first_audio_ms"] > 0
    assert len(done.report["rvq_codes"]) == 15 and {"stages", "rtf"} <= set(done.report)


def test_s16le_chunks(shared_daemon):
    with Client(shared_daemon.endpoint) as client:
        f32 = client.speak("Same text twice.", play=False, stream=True, max_audio_ms=400, sampling={"seed": 1})
        s16 = client.speak("Same text twice.", play=False, stream=True, max_audio_ms=400, sampling={"seed": 1},
                           format="s16le")
        f32.wait(), s16.wait()
    assert s16.pcm.dtype == np.int16 and s16.pcm.shape == f32.pcm.shape
    assert np.abs(s16.pcm / 32767.0 - f32.pcm).max() <= 1.0 / 32767 + 1e-6


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_32_concurrent_requests_from_4_clients(start_daemon, transport, tmp_path):
    """Over tcp:// with CURVE (every client authorized), as a deployment serves it."""
    import zmq.auth

    endpoint, config, keys = None, "[daemon]\nqueue_limit = 40\n", {}
    if transport == "tcp":
        for d in ("server", "authorized"):
            (tmp_path / d).mkdir()
        _, server_secret = zmq.auth.create_certificates(str(tmp_path / "server"), "server")
        client_public, client_secret = zmq.auth.create_certificates(str(tmp_path / "authorized"), "client")
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        config += f'curve_secret_key = "{server_secret}"\ncurve_authorized_dir = "{tmp_path / "authorized"}"\n'
        keys = {"server_key": str(tmp_path / "server" / "server.key"), "certificate": client_secret}
    daemon = start_daemon(config=config, endpoint=endpoint)
    results: dict[int, list] = {}

    def client_thread(n: int) -> None:
        with Client(daemon.endpoint, timeout_s=120, **keys) as client:
            utterances = [client.speak(f"Client {n} request {i}.", play=False, stream=i % 2 == 0,
                                       max_audio_ms=80 * (3 + i)) for i in range(8)]
            results[n] = [list(u) for u in utterances]

    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == [0, 1, 2, 3]
    for n, utterances in results.items():
        for i, events in enumerate(utterances):
            names = [type(e).__name__ for e in events]
            assert names[0] == "Accepted" and names.count("Done") == 1 and names[-1] == "Done", (n, i, names)
            assert events[-1].reason == "length" and events[-1].report["frames"] == 3 + i


def test_cancel_ends_a_reply_within_a_chunk_of_the_audio_the_client_had(shared_daemon):
    """The client cancels having received R frames of audio: `done` counts at most R + one chunk (the
    frames the vocoder still held in its window). So that the daemon cannot run ahead of what the
    client has seen, the reply is streamed text that runs out: the client asks `status` until the
    reply waits for more text, has by then every chunk sent before (replies to one client keep their
    order), cancels, and sends more text at once: a cancel that landed later than the next frame
    boundary would speak some of it."""
    from edged.artifact import BUILTIN, load_artifact
    from edged.config import Config

    samples_per_frame, chunk = load_artifact(BUILTIN).samples_per_frame, Config().vocoder.chunk_frames
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(shared_daemon.endpoint)

    def send(msg) -> None:
        sock.send_multipart(protocol.encode(msg))

    def reply():
        return protocol.decode_reply(sock.recv_multipart())[0]

    try:
        send(protocol.Speak(id="c", text="", more_text=True, play=False, stream=True, max_audio_ms=20000))
        send(protocol.Text(id="c", text="A reply whose text runs out long before the daemon has said all of it "))
        received, waiting, deadline = 0, False, time.monotonic() + 60
        while not waiting:
            assert time.monotonic() < deadline, "the reply never waited for its text"
            send(protocol.Status())
            while (msg := reply()).op != "status":
                assert msg.op in ("accepted", "audio"), msg
                received += msg.samples if msg.op == "audio" else 0
            waiting = "c" in msg.fields["cohort"]["waiting_for_text"]
        send(protocol.Cancel(id="c"))
        send(protocol.Text(id="c", text="and this, sent after the cancel, is never spoken. " * 8, final=True))
        while (msg := reply()).op != "done":
            assert msg.op in ("audio", "error"), msg  # error: the text came after the reply had ended
    finally:
        sock.close()
    had = received // samples_per_frame
    assert msg.reason == "cancelled" and had >= 1
    assert msg.report["frames"] <= had + chunk, (msg.report["frames"], had)
    assert msg.report["frames"] - msg.report["cancelled_at_frame"] <= 1  # the report's own stamp agrees


def test_newcomer_starts_before_running_members_end(shared_daemon):
    with Client(shared_daemon.endpoint) as client:
        long = client.speak("A long utterance already running.", play=False, stream=True, max_audio_ms=16000)
        first = next(e for e in long if type(e).__name__ == "Audio")
        short = client.speak("A short one joins.", play=False, stream=True, max_audio_ms=400)
        short_done = short.wait()
        assert not long.finished, "the newcomer finished while the long one still runs"
        long_done = long.wait()
    assert first.seq == 0
    assert short_done.reason == long_done.reason == "length"
    assert long_done.report["frames"] == 200 and short_done.report["frames"] == 5


def test_a_flood_of_bad_messages_from_many_clients_is_answered_and_the_daemon_keeps_serving(shared_daemon):
    """64 clients at once, each sending garbage, a bad speak and a status: every one gets its two
    errors and its status, and a speak after the flood is served."""
    ctx = zmq.Context.instance()
    socks = []
    try:
        for _ in range(64):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 30000)
            sock.connect(shared_daemon.endpoint)
            socks.append(sock)
        for sock in socks:
            sock.send(b"\xc1garbage")
            sock.send(msgpack.packb({"op": "speak", "id": "x", "text": "hi", "play": 3}))
            sock.send(msgpack.packb({"op": "status"}))
        for sock in socks:
            ops = [msgpack.unpackb(sock.recv())["op"] for _ in range(3)]
            assert ops == ["error", "error", "status"], ops
    finally:
        for sock in socks:
            sock.close()
    with Client(shared_daemon.endpoint) as client:
        assert client.speak("Still serving.", play=False, max_audio_ms=160).wait().reason == "length"


def test_malformed_and_oversized_get_error_and_daemon_keeps_serving(shared_daemon):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.connect(shared_daemon.endpoint)
    cases = {
        b"\xc1garbage": "not valid msgpack",
        msgpack.packb([1, 2]): "must be a msgpack map",
        msgpack.packb({"id": "x"}): "no 'op' field",
        msgpack.packb({"op": "dance", "id": "x"}): "unknown op 'dance'",
        msgpack.packb({"op": "speak", "id": "x"}): "speak: missing field 'text'",
        msgpack.packb({"op": "speak", "id": "x", "text": "hi", "play": "yes"}): "speak.play must be a bool",
        msgpack.packb({"op": "speak", "id": "x", "text": "hi", "more_text": True, "text_filter": "markdown"}):
            "speak.text_filter must be one of 'llm', 'none', or nil, got str 'markdown'",
        msgpack.packb({"op": "speak", "id": "x", "text": "hi", "voise": "a"}): "unknown field 'voise'",
        msgpack.packb({"op": "speak", "id": "x", "text": "a" * (2 << 20)}): "message too large",
        msgpack.packb({"op": "speak", "id": "x", "text": "hi", **{f"k{i}": i for i in range(50000)}}): "unknown field",
        b"\x91" * 5000 + b"\xc0": "nested too deeply",
        msgpack.packb({"op": "speak", "id": "x"})[:-1] + b"\xa3\xff\xfe\xfd": "not valid msgpack",
        b"\x83\xa2op\xa5speak\xa2id\xa1x\xa4text\xa3\xff\xfe\xfd": "not valid msgpack",  # text: invalid UTF-8
        msgpack.packb({"op": "speak", "id": 1.5, "text": "hi"}): "id must be",
        msgpack.packb({"op": "status", "extra": {"a": [1, 2, {"b": None}]}}): "unknown field 'extra'",
    }
    try:
        for raw, reason in cases.items():
            sock.send(raw)
            reply = msgpack.unpackb(sock.recv())
            assert reply["op"] == "error" and reason in reply["reason"], (reason, reply)
    finally:
        sock.close()
    with Client(shared_daemon.endpoint) as client:
        assert client.speak("Still serving.", play=False, max_audio_ms=160).wait().reason == "length"
        assert client.status()["state"] == "serving"


@pytest.mark.parametrize("kwargs,reason", [
    ({"voice": "nobody"}, "unknown voice 'nobody'"),
    ({"language": "klingon"}, "unknown language 'klingon'"),
    ({"sampling": {"temperature": -1.0}}, "sampling.temperature must be in"),
    ({"sampling": {"top_p": 0.0}}, "sampling.top_p must be in"),
])
def test_admission_rejects_with_a_reason(shared_daemon, kwargs, reason):
    with Client(shared_daemon.endpoint) as client, pytest.raises(RequestRejected, match=reason):
        client.speak("Hello.", play=False, **kwargs).wait()


def test_too_long_and_duplicate_id(shared_daemon):
    with Client(shared_daemon.endpoint) as client, pytest.raises(RequestRejected, match="text too long"):
        client.speak("word " * 700, play=False).wait()
    # the same client may not reuse an id while it is in flight (a raw socket: the client library
    # refuses that itself); a second client may (ids are per client)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(shared_daemon.endpoint)
    speak = {"op": "speak", "id": "same", "text": "Long enough to be in flight.", "play": False, "max_audio_ms": 60000}
    try:
        sock.send(msgpack.packb(speak))
        assert msgpack.unpackb(sock.recv())["op"] == "accepted"
        sock.send(msgpack.packb(speak))
        assert msgpack.unpackb(sock.recv()) == {"op": "rejected", "id": "same", "reason": "duplicate id in flight"}
        with Client(shared_daemon.endpoint) as other:
            assert other.speak("Other client, same id.", id="same", play=False, max_audio_ms=160).wait().reason == "length"
        sock.send(msgpack.packb({"op": "cancel", "id": "same"}))
        done = msgpack.unpackb(sock.recv())
        assert done["op"] == "done" and done["id"] == "same" and done["reason"] == "cancelled"
    finally:
        sock.close()


def test_busy_when_the_queue_is_full(start_daemon):
    """4 slots + 1 queued, the other 3 busy: the requests are a minute of audio each, so none can end
    before all 8 have been answered, however the machine is loaded."""
    daemon = start_daemon(config="[daemon]\nqueue_limit = 1\n")
    with Client(daemon.endpoint, timeout_s=120) as client:
        utterances = [client.speak(f"Request {i}.", play=False, max_audio_ms=60000) for i in range(8)]
        answers = [u.next_event() for u in utterances]
        assert [a.op for a in answers].count("accepted") == 5
        assert [a.reason for a in answers if a.op == "rejected"] == ["busy"] * 3
        for u in utterances:
            if u.accepted:
                u.cancel()
        assert {u.wait().reason for u in utterances if u.accepted} == {"cancelled"}


def test_cli_say_and_status(shared_daemon, tmp_path):
    """`edged say` prints the done report; `edged status` shows the cohort, the speaker and the microphone,
    and the engines' activation memory as one line (none on ONNX Runtime; TensorRT's shared block)."""
    import json
    import subprocess
    import sys

    edged = [sys.executable, "-m", "edged"]
    wav = tmp_path / "hello.wav"
    said = subprocess.run([*edged, "say", "Hello there.", "--max-audio-ms", "400", "--no-play", "--out", str(wav),
                           "--endpoint", shared_daemon.endpoint], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    report = json.loads(said.stdout)
    assert report["reason"] == "length" and report["frames"] == 5 and "played_ms" not in report
    assert wav.stat().st_size == 44 + 5 * 1920 * 2
    shown = subprocess.run([*edged, "status", "--endpoint", shared_daemon.endpoint], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = dict(line.split(None, 1) for line in shown.stdout.splitlines() if line.split(None, 1)[0] in
                ("state", "speaker", "microphone", "history"))
    raw = json.loads(subprocess.run([*edged, "status", "--json", "--endpoint", shared_daemon.endpoint],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert rows["state"] == "serving"
    assert rows["speaker"].startswith(raw["audio"]["output"]["state"])
    assert rows["microphone"].startswith(raw["audio"]["input"]["state"])
    assert rows["history"].startswith(f"policy {raw['history']['policy']}")
    assert raw["memory"]["activations"] == 0
    assert [line.split() for line in shown.stdout.splitlines() if "activations" in line] == \
        [["memory", "activations", "0.00", "MiB"]]


def test_an_unknown_language_is_refused_naming_every_language_status_lists(shared_daemon):
    """The languages a rejection lists are the ones a speak takes: status's model.languages and auto."""
    with Client(shared_daemon.endpoint) as client:
        languages = client.status()["model"]["languages"]
        with pytest.raises(RequestRejected) as refused:
            client.speak("Hello.", play=False, language="klingon").wait()
        assert str(refused.value).endswith(f"(known: {', '.join(['auto', *languages])})"), refused.value
        for language in languages:
            assert client.speak("Hello.", play=False, language=language, max_audio_ms=80).wait().reason == "length"


def test_what_boot_made_is_frozen_out_of_full_collections(shared_daemon):
    """status.collector: the daemon froze its boot objects (the tiny artifact's are tens of
    thousands), so a full collection on the step path walks only what came after them."""
    with Client(shared_daemon.endpoint) as client:
        client.speak("Hello there.", play=False, max_audio_ms=160).wait()
        collector = client.status()["collector"]
    assert collector["frozen"] > 10_000, collector
    assert isinstance(collector["full_collections"], int) and collector["full_collections"] >= 1, collector
