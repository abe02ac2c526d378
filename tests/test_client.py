"""The client library (`edged.client`) against an in-process fake daemon (a real ROUTER over ipc://)."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
import zmq
from support.wire import pack, speak_header

from edged import protocol
from edged.client import Audio, Client, RequestRejected, Utterance
from edged.locate import NoDaemon
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
                msg, _ = decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
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
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # listens, never answers
    silent.bind(f"ipc://{tmp_path}/silent.sock")
    try:
        with Client(f"ipc://{tmp_path}/silent.sock", timeout_s=0.1) as c:
            with pytest.raises(TimeoutError, match="status: no reply within 0.1 s"):
                c.status()
            with pytest.raises(TimeoutError, match="history 's': no reply"):
                c.history("s")
    finally:
        silent.close(linger=0)
    t0 = time.monotonic()  # nothing listening at an explicit ipc endpoint: said at once, not waited out
    with pytest.raises(NoDaemon, match=f"no daemon found \\(ipc://{tmp_path}/nobody.sock: no such socket\\)"):
        Client(f"ipc://{tmp_path}/nobody.sock", timeout_s=30)
    assert time.monotonic() - t0 < 5
