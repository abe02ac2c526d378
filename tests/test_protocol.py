"""Protocol v1: every op round-trips, every malformed message gets a reason naming what was wrong,
and the client library against an in-process fake daemon (a real ROUTER over ipc://)."""

from __future__ import annotations

import dataclasses
import queue
import threading

import msgpack
import numpy as np
import pytest
import zmq

from edged import protocol
from edged.client import Audio, Client, RequestRejected, Utterance
from edged.protocol import (
    Accepted,
    Ack,
    Cancel,
    Done,
    Error,
    History,
    HistoryReply,
    ProtocolError,
    Rejected,
    Speak,
    Status,
    StatusReply,
    Text,
    Turn,
    decode,
    decode_reply,
    encode,
)
from edged.request import Sampling


def pack(header: object) -> list[bytes]:
    return [msgpack.packb(header, use_bin_type=True)]


def speak_header(**extra) -> dict:
    return {"op": "speak", "id": "r1", "text": "hi", **extra}


# --- round trips

REQUESTS = [
    Speak(id="r1", text="hello"),
    Speak(id=7, text="hello", more_text=True, session="s", voice="vivian", language="english", instruct="calm",
          play=False, stream=True, format="s16le", max_audio_ms=5000,
          sampling={"temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1,
                    "cp_temperature": 0.5, "cp_top_k": 10, "cp_top_p": 1, "seed": 3},
          report_codes=True),
    Speak(id="x" * protocol.MAX_ID_CHARS, text="", sampling={"seed": None}),
    Text(id="r1", text="more"),
    Text(id="r1", text="", final=True),
    Cancel(id="r1"),
    Cancel(id=-(2**63)),
    Ack(id="r1", played_ms=0),
    Ack(id="r1", played_ms=1234.5, final=True),
    Turn(session="s", role="user", content="hi there"),
    Turn(session="s", role="system", content="be brief"),
    Turn(session="s", role="assistant", content="ok"),
    History(session="s"),
    History(session="s", wait=True),
    History(session="s", wait=True, close=True),
    Status(),
]

REPLIES = [
    (Accepted(id="r1"), None),
    (Rejected(id=2**64 - 1, reason="queue full"), None),
    (protocol.Audio(id="r1", seq=0, sample_rate=24000, format="f32le", first_sample=0, samples=3),
     np.array([0.0, 0.5, -1.0], "<f4").tobytes()),
    (protocol.Audio(id="r1", seq=1, sample_rate=24000, format="s16le", first_sample=3, samples=2),
     np.array([1, -2], "<i2").tobytes()),
    (Done(id="r1", reason="eos", report={"frames": 3, "audio_ms": 240, "stages": {"talker": 1.5}}), None),
    (Done(id="r1", reason="error", error="engine failed"), None),
    (HistoryReply(session="s", turns=[{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hel", "interrupted": True,
                                       "response_id": "r1"},
                                      {"role": "assistant", "content": "", "interrupted": False,
                                       "response_id": 7, "pending": True}]), None),
    (StatusReply(fields={"uptime_s": 3.5, "active": 1, "model": "tiny"}), None),
    (StatusReply(), None),
    (Error(reason="bad"), None),
    (Error(reason="bad", id="r1"), None),
]


@pytest.mark.parametrize("msg", REQUESTS, ids=lambda m: m.op)
def test_request_round_trip(msg):
    frames = encode(msg)
    assert len(frames) == 1
    assert decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES) == msg


@pytest.mark.parametrize("msg,pcm", REPLIES, ids=lambda m: getattr(m, "op", "pcm"))
def test_reply_round_trip(msg, pcm):
    frames = encode(msg, pcm)
    assert len(frames) == (1 if pcm is None else 2)
    assert decode_reply(frames) == (msg, pcm)


def test_every_op_has_a_round_trip():
    assert {m.op for m in REQUESTS} == set(protocol.REQUESTS)
    assert {type(m) for m, _ in REPLIES} == set(protocol.REPLIES.values())


def test_pcm_buffers_are_sent_as_given():
    samples = np.linspace(-1, 1, 6, dtype="<f4")
    header = protocol.Audio(id="r1", seq=0, sample_rate=24000, format="f32le", first_sample=0, samples=6)
    frames = encode(header, memoryview(samples))
    assert isinstance(frames[1], memoryview)  # not copied
    assert decode_reply(frames) == (header, samples.tobytes())
    with pytest.raises(ProtocolError, match="binary frame has 12 bytes, expected 24"):
        encode(header, memoryview(samples[:3]))


def test_none_fields_are_left_out_and_ids_echo_exactly():
    header = msgpack.unpackb(encode(Speak(id=12, text="a"))[0])
    assert "voice" not in header and "sampling" not in header and header["id"] == 12
    assert msgpack.unpackb(encode(StatusReply({"a": 1}))[0]) == {"op": "status", "a": 1}
    # absent and nil mean the same for optional fields
    assert decode(pack(speak_header(voice=None, max_audio_ms=None))) == Speak(id="r1", text="hi")


def test_sampling_keys_are_the_runtime_keys():
    assert set(protocol.SAMPLING_KEYS) == {f.name for f in dataclasses.fields(Sampling)}


def test_encode_checks_like_decode():
    with pytest.raises(ProtocolError, match=r"speak.format must be one of 'f32le', 's16le', got str 'wav'"):
        encode(Speak(id="r1", text="a", format="wav"))
    with pytest.raises(ProtocolError, match="unexpected binary frame: speak carries none"):
        encode(Speak(id="r1", text="a"), b"\0\0")
    with pytest.raises(ProtocolError, match="audio: missing the binary PCM frame"):
        encode(protocol.Audio(id="r1", seq=0, sample_rate=24000, format="f32le", first_sample=0, samples=1))
    with pytest.raises(ProtocolError, match="must not contain 'op'"):
        encode(StatusReply({"op": "x"}))
    with pytest.raises(ProtocolError, match="done: cannot encode"):
        encode(Done(id="r1", reason="eos", report={"x": object()}))


# --- malformed client -> server messages

MALFORMED = [
    # (frames, reason substring, echoed id)
    ([], "empty message: no frames", None),
    ([b""], "empty header frame", None),
    ([b"\xc1"], "header is not valid msgpack", None),
    ([msgpack.packb({"op": "status"})[:-2]], "header is not valid msgpack", None),
    ([msgpack.packb({"op": "status"}) + b"\x00"], "extra bytes after the first object", None),
    ([b"\x91" * 5000 + b"\xc0"], "nested too deeply", None),
    ([b"\x81\xa2op\xa2\xff\xfe"], "header is not valid msgpack: UnicodeDecodeError", None),
    ([msgpack.packb({1: "status"})], "header is not valid msgpack", None),
    (pack([1, 2]), "header must be a msgpack map, got array", None),
    (pack("speak"), "header must be a msgpack map, got str 'speak'", None),
    (pack({"id": "r1", "text": "hi"}), "header has no 'op' field", "r1"),
    (pack({"op": 3}), "'op' must be a string, got int 3", None),
    (pack({"op": "speek", "id": "r1"}), "unknown op 'speek' (known: speak, text, cancel, ack, turn, history, status)",
     "r1"),
    (pack({"op": "accepted", "id": "r1"}), "unknown op 'accepted'", "r1"),
    # missing fields
    (pack({"op": "speak", "id": "r1"}), "speak: missing field 'text'", "r1"),
    (pack({"op": "speak", "text": "hi"}), "speak: missing field 'id'", None),
    (pack({"op": "text", "id": "r1"}), "text: missing field 'text'", "r1"),
    (pack({"op": "cancel"}), "cancel: missing field 'id'", None),
    (pack({"op": "ack", "id": "r1"}), "ack: missing field 'played_ms'", "r1"),
    (pack({"op": "turn", "session": "s", "content": "c"}), "turn: missing field 'role'", None),
    (pack({"op": "history"}), "history: missing field 'session'", None),
    # mistyped fields
    (pack(speak_header(play="yes")), "speak.play must be a bool, got str 'yes'", "r1"),
    (pack(speak_header(stream=1)), "speak.stream must be a bool, got int 1", "r1"),
    (pack(speak_header(text=None)), "speak.text must be a string, got nil", "r1"),
    (pack(speak_header(voice=3)), "speak.voice must be a string or nil, got int 3", "r1"),
    (pack(speak_header(format="wav")), "speak.format must be one of 'f32le', 's16le', got str 'wav'", "r1"),
    (pack(speak_header(max_audio_ms=0)), "speak.max_audio_ms must be an integer > 0, or nil, got int 0", "r1"),
    (pack(speak_header(max_audio_ms=1.5)), "speak.max_audio_ms must be an integer > 0, or nil, got float", "r1"),
    (pack(speak_header(max_audio_ms=True)), "speak.max_audio_ms must be an integer > 0, or nil, got bool", "r1"),
    (pack(speak_header(sampling=[1])), "speak.sampling must be a map or nil, got array", "r1"),
    (pack(speak_header(sampling={"temprature": 1.0})), "speak.sampling: unknown key 'temprature'", "r1"),
    (pack(speak_header(sampling={"top_k": "5"})), "speak.sampling.top_k must be a number, got str '5'", "r1"),
    (pack(speak_header(sampling={"temperature": True})), "speak.sampling.temperature must be a number, got bool",
     "r1"),
    (pack(speak_header(sampling={"seed": 1.5})), "speak.sampling.seed must be an integer or nil, got float 1.5",
     "r1"),
    (pack(speak_header(report_codes="no")), "speak.report_codes must be a bool", "r1"),
    (pack(speak_header(id="")), "speak.id must be a non-empty string of at most 128 characters, or an integer",
     None),
    (pack(speak_header(id="x" * 129)), "speak.id must be a non-empty string of at most 128 characters", None),
    (pack(speak_header(id=1.0)), "speak.id must be a non-empty string", None),
    (pack(speak_header(id=True)), "speak.id must be a non-empty string", None),
    (pack(speak_header(id=[1])), "speak.id must be a non-empty string", None),
    (pack({"op": "text", "id": "r1", "text": "a", "final": 0}), "text.final must be a bool, got int 0", "r1"),
    (pack({"op": "ack", "id": "r1", "played_ms": -1}), "ack.played_ms must be a finite number >= 0, got int -1", "r1"),
    (pack({"op": "ack", "id": "r1", "played_ms": True}), "ack.played_ms must be a finite number >= 0, got bool",
     "r1"),
    (pack({"op": "ack", "id": "r1", "played_ms": float("nan")}), "ack.played_ms must be a finite number", "r1"),
    (pack({"op": "turn", "session": "s", "role": "bot", "content": "c"}),
     "turn.role must be one of 'user', 'system', 'assistant', got str 'bot'", None),
    (pack({"op": "turn", "session": None, "role": "user", "content": "c"}), "turn.session must be a string, got nil",
     None),
    (pack({"op": "history", "session": "s", "wait": "true"}), "history.wait must be a bool", None),
    # unknown fields
    (pack(speak_header(voise="vivian")), "speak: unknown field 'voise' (fields: id, text, more_text,", "r1"),
    (pack({"op": "status", "verbose": True}), "status: unknown field 'verbose' (fields: none)", None),
    (pack({"op": "status", "id": "q"}), "status: unknown field 'id'", "q"),
    (pack({"op": "turn", "session": "s", "role": "user", "content": "c", "id": 5}), "turn: unknown field 'id'", 5),
    # frames
    (pack(speak_header()) + [b"\0\0\0\0"], "unexpected binary frame: speak carries none", "r1"),
    (pack({"op": "status"}) + [b""], "unexpected binary frame: status carries none", None),
    (pack(speak_header()) + [b"a", b"b"], "too many frames: 3", "r1"),
]


@pytest.mark.parametrize("frames,reason,id", MALFORMED, ids=lambda x: None)
def test_malformed_request_names_what_is_wrong(frames, reason, id):
    with pytest.raises(ProtocolError) as e:
        decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
    assert reason in e.value.reason
    assert str(e.value) == e.value.reason
    assert e.value.id == id and type(e.value.id) is type(id)


def test_oversized_is_rejected_before_unpacking(monkeypatch):
    def unpack(*args, **kwargs):
        raise AssertionError("unpacked an oversized message")

    monkeypatch.setattr(protocol.msgpack, "unpackb", unpack)
    blob = b"\x00" * (64 << 20)
    with pytest.raises(ProtocolError, match=r"message too large: 67108864 bytes \(max 1048576\)"):
        decode([blob], max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
    # all frames count, and the limit is the caller's
    with pytest.raises(ProtocolError, match=r"message too large: 1001 bytes \(max 1000\)"):
        decode([b"\x80" * 500, b"\x00" * 501], max_bytes=1000)


def test_max_bytes_is_inclusive():
    frames = pack(speak_header(text="a" * 100))
    assert decode(frames, max_bytes=len(frames[0])).text == "a" * 100
    with pytest.raises(ProtocolError, match="too large"):
        decode(frames, max_bytes=len(frames[0]) - 1)


def test_requests_are_not_replies_and_replies_are_not_requests():
    with pytest.raises(ProtocolError, match="unknown op 'speak'"):
        decode_reply(encode(Speak(id="r1", text="a")))
    with pytest.raises(ProtocolError, match="unknown op 'done'"):
        decode(encode(Done(id="r1", reason="eos")))


MALFORMED_REPLIES = [
    (pack({"op": "audio", "id": "r1", "seq": 0, "sample_rate": 24000, "format": "f32le", "first_sample": 0,
           "samples": 2}), "audio: missing the binary PCM frame"),
    (pack({"op": "audio", "id": "r1", "seq": 0, "sample_rate": 24000, "format": "f32le", "first_sample": 0,
           "samples": 2}) + [b"\0" * 4], "audio: binary frame has 4 bytes, expected 8 (2 samples of f32le)"),
    (pack({"op": "audio", "id": "r1", "seq": -1, "sample_rate": 24000, "format": "f32le", "first_sample": 0,
           "samples": 0}) + [b""], "audio.seq must be an integer >= 0, got int -1"),
    (pack({"op": "done", "id": "r1", "reason": "finished"}), "done.reason must be one of 'eos', 'length', 'cancelled'"),
    (pack({"op": "done", "id": "r1", "reason": "eos", "report": []}), "done.report must be a map, got array"),
    (pack({"op": "history", "session": "s", "turns": [{"role": "user"}]}), "history.turns[0]: missing key 'content'"),
    (pack({"op": "history", "session": "s", "turns": [{"role": "user", "content": "a", "heard": 1}]}),
     "history.turns[0]: unknown key 'heard'"),
    (pack({"op": "history", "session": "s", "turns": [{"role": "user", "content": "a", "interrupted": 1}]}),
     "history.turns[0].interrupted must be a bool"),
    (pack({"op": "accepted", "id": "r1"}) + [b"x"], "unexpected binary frame: accepted carries none"),
    (pack({"op": "error"}), "error: missing field 'reason'"),
]


@pytest.mark.parametrize("frames,reason", MALFORMED_REPLIES, ids=lambda x: None)
def test_malformed_reply_names_what_is_wrong(frames, reason):
    with pytest.raises(ProtocolError) as e:
        decode_reply(frames)
    assert reason in e.value.reason


# --- the client against a fake daemon


def chunk_pcm(seq: int, fmt: str) -> np.ndarray:
    values = np.arange(4) + 4 * seq
    return (values / 8).astype("<f4") if fmt == "f32le" else values.astype("<i2")


class FakeDaemon:
    """A ROUTER that answers like the daemon: speak -> accepted, 2 audio chunks (if stream), done.

    Speaks whose text starts with "pair" are held until two have arrived, then answered
    interleaved. Text "reject" is rejected, "silent" gets no reply, "bad" gets an error with its id,
    "badseq" gets audio seq 1 first. Every decoded message is put on `received`.
    """

    def __init__(self, endpoint: str):
        self.socket: zmq.Socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.received: queue.Queue = queue.Queue()
        self.held: list[tuple[bytes, Speak]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.socket.close()

    def send(self, peer: bytes, msg, pcm=None) -> None:
        self.socket.send_multipart([peer, *encode(msg, pcm)])

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.socket.poll(20):
                continue
            peer, *frames = self.socket.recv_multipart()
            try:
                msg = decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
            except ProtocolError as e:
                self.send(peer, Error(reason=e.reason, id=e.id))
                continue
            self.received.put(msg)
            self.handle(peer, msg)

    def replies(self, speak: Speak) -> list[tuple]:
        out: list[tuple] = [(Accepted(id=speak.id), None)]
        if speak.stream:
            for seq in range(2):
                pcm = chunk_pcm(seq, speak.format)
                out.append((protocol.Audio(id=speak.id, seq=seq, sample_rate=24000, format=speak.format,
                                           first_sample=4 * seq, samples=4), pcm))
        out.append((Done(id=speak.id, reason="eos", report={"frames": 2, "audio_ms": 0.33}), None))
        return out

    def handle(self, peer: bytes, msg) -> None:
        if isinstance(msg, Status):
            self.send(peer, StatusReply({"active": len(self.held)}))
        elif isinstance(msg, History):
            if msg.session == "broken":
                self.send(peer, Error(reason="no such session"))
            else:
                self.send(peer, HistoryReply(session=msg.session, turns=[{"role": "user", "content": "hi"}]))
        elif not isinstance(msg, Speak) or msg.text == "silent":
            pass
        elif msg.text == "reject":
            self.send(peer, Rejected(id=msg.id, reason="queue full"))
        elif msg.text == "bad":
            self.send(peer, Error(reason="cannot read this speak", id=msg.id))
        elif msg.text == "badseq":
            self.send(peer, Accepted(id=msg.id))
            self.send(peer, protocol.Audio(id=msg.id, seq=1, sample_rate=24000, format="f32le", first_sample=0,
                                           samples=4), chunk_pcm(0, "f32le"))
        elif msg.text.startswith("pair"):
            self.held.append((peer, msg))
            if len(self.held) == 2:
                a, b = (self.replies(m) for _, m in self.held)
                for x, y in zip(a, b):  # interleaved, the second speak's reply first
                    self.send(peer, *y)
                    self.send(peer, *x)
                self.held.clear()
        else:
            for reply in self.replies(msg):
                self.send(peer, *reply)


@pytest.fixture
def endpoint(tmp_path) -> str:
    return f"ipc://{tmp_path}/edged.sock"


@pytest.fixture
def daemon(endpoint):
    d = FakeDaemon(endpoint)
    yield d
    d.close()


def test_speak_yields_accepted_audio_done(daemon, endpoint):
    with Client(endpoint, timeout_s=5) as c:
        u = c.speak("hello", id="u1", stream=True, play=False)
        events = list(u)
        assert [type(e) for e in events] == [Accepted, Audio, Audio, Done]
        assert [e.seq for e in events if isinstance(e, Audio)] == [0, 1]
        assert events[1].pcm.dtype == np.float32 and np.array_equal(events[1].pcm, chunk_pcm(0, "f32le"))
        assert u.wait() == events[-1] and u.done.report == {"frames": 2, "audio_ms": 0.33}
        assert np.array_equal(u.pcm, np.concatenate([chunk_pcm(0, "f32le"), chunk_pcm(1, "f32le")]))
        assert u.sample_rate == 24000
    sent = daemon.received.get(timeout=1)
    assert sent == Speak(id="u1", text="hello", stream=True, play=False)


def test_s16le_and_auto_ids(daemon, endpoint):
    with Client(endpoint, timeout_s=5) as c:
        u = c.speak("hello", stream=True, format="s16le")
        assert isinstance(u.id, str) and len(u.id) == 32
        pcm = u.audio()
        assert pcm.dtype == np.int16 and pcm.tolist() == list(range(8))
        assert c.speak("no stream").audio().size == 0


def test_two_interleaved_utterances_are_demultiplexed(daemon, endpoint):
    with Client(endpoint, timeout_s=5) as c:
        first = c.speak("pair one", id="a", stream=True)
        second = c.speak("pair two", id=2, stream=True, format="s16le")
        # read the second first: the first's replies wait in the buffer meanwhile
        assert second.wait().id == 2
        assert second.pcm.tolist() == list(range(8))
        assert [type(e) for e in first] == [Accepted, Audio, Audio, Done]
        assert first.done.id == "a" and first.pcm.dtype == np.float32 and first.pcm.size == 8
        assert c.status() == {"active": 0}


def test_rejected_and_error_replies(daemon, endpoint):
    with Client(endpoint, timeout_s=5) as c:
        u = c.speak("reject")
        assert [type(e) for e in u] == [Rejected]
        assert u.accepted is False and u.rejected == "queue full"
        with pytest.raises(RequestRejected, match="queue full"):
            u.wait()
        with pytest.raises(ProtocolError, match="cannot read this speak") as e:
            c.speak("bad", id="b").wait()
        assert e.value.id == "b"
        with pytest.raises(ProtocolError, match="no such session"):  # an error without id: the waiting call raises
            c.history("broken")
        assert c.history("s") == [{"role": "user", "content": "hi"}]
        with pytest.raises(ProtocolError, match="audio seq 1, expected 0"):  # the client checks ordering
            c.speak("badseq").wait()


def test_fire_and_forget_messages_reach_the_daemon(daemon, endpoint):
    with Client(endpoint, timeout_s=5) as c:
        u = c.speak("silent", id="s1", more_text=True)
        u.send_text("more")
        c.send_text("s1", "end", final=True)
        u.ack(120.5)
        c.ack("s1", 200, final=True)
        u.cancel()
        c.turn("sess", "user", "hello")
        assert c.status() == {"active": 0}  # the daemon has read everything sent before
    got = [daemon.received.get(timeout=1) for _ in range(8)]
    assert got == [Speak(id="s1", text="silent", more_text=True), Text(id="s1", text="more"),
                   Text(id="s1", text="end", final=True), Ack(id="s1", played_ms=120.5),
                   Ack(id="s1", played_ms=200, final=True), Cancel(id="s1"),
                   Turn(session="sess", role="user", content="hello"), Status()]


def test_garbage_gets_an_error_and_the_daemon_carries_on(daemon, endpoint):
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.connect(endpoint)
    try:
        raw.send_multipart([b"\xc1garbage"])
        reply, _ = decode_reply(raw.recv_multipart())
        assert isinstance(reply, Error) and reply.id is None and "not valid msgpack" in reply.reason
        raw.send_multipart(pack(speak_header(id="g", voise="vivian")))
        reply, _ = decode_reply(raw.recv_multipart())
        assert reply == Error(reason=reply.reason, id="g") and "unknown field 'voise'" in reply.reason
        raw.send_multipart(pack({"op": "status"}))
        assert decode_reply(raw.recv_multipart()) == (StatusReply({"active": 0}), None)
    finally:
        raw.close()


def test_timeouts_name_what_was_awaited(daemon, endpoint, tmp_path):
    with Client(endpoint, timeout_s=0.2) as c:
        u = c.speak("silent", id="quiet")
        with pytest.raises(TimeoutError, match=r"speak 'quiet': accepted: no reply within 0.2 s"):
            u.wait()
        assert isinstance(u, Utterance) and not u.finished
        assert c.speak("hello").wait().reason == "eos"  # the client still works after a timeout
        with pytest.raises(ValueError, match="already in flight"):
            c.speak("again", id="quiet")
    with Client(f"ipc://{tmp_path}/nobody.sock", timeout_s=0.1) as c:
        with pytest.raises(TimeoutError, match="status: no reply within 0.1 s"):
            c.status()
        with pytest.raises(TimeoutError, match="history 's': no reply"):
            c.history("s")
