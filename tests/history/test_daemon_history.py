"""History through the real daemon: sessions, turns in order, acks from a client that plays the
streamed audio itself, the rate policy's heard prefix, and durability through kill -9."""

from __future__ import annotations

import signal

import pytest
from support.daemon import Daemon
from support.heard import GUARD_MS, RATE_CONFIG, expected_prefix

from edged.client import Client

TEXT = "Hello there, this is a test of the history, and it goes on for a while."
CONFIG = f'[events]\nlisten = "none"\n[audio]\ndevice = "none"\ninput_device = "none"\n{RATE_CONFIG}'


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, config=CONFIG)
    yield d
    d.close()


def test_turns_keep_their_order_and_acks_give_the_heard_prefix(daemon):
    with Client(daemon.endpoint) as client:
        client.turn("conv", "system", "You are a robot.")
        client.turn("conv", "user", "Tell me something.")
        utt = client.speak(TEXT, session="conv", play=False, stream=True, max_audio_ms=4000)
        client.turn("conv", "user", "Stop.")  # sent while the reply is still being generated
        done = utt.wait()
        assert done.reason == "length"
        for ms in (500, 1000, 1500):  # periodic acks while the client plays it
            client.ack(utt.id, ms)
        client.ack(utt.id, 1700, final=True)  # the client's playback was cut here
        turns = client.history("conv", wait=True)
        messages = client.messages("conv")
    heard = expected_prefix(TEXT, 1700)
    assert heard and TEXT.startswith(heard) and len(heard) < len(TEXT)
    assert turns == [{"role": "system", "content": "You are a robot."},
                     {"role": "user", "content": "Tell me something."},
                     {"role": "assistant", "content": heard, "interrupted": True, "response_id": utt.id},
                     {"role": "user", "content": "Stop."}]
    assert messages == [{"role": t["role"], "content": t["content"]} for t in turns]  # what an LLM takes


def test_policy_none_keeps_an_interrupted_reply_all_or_nothing(tmp_path):
    """history.policy = "none": a reply heard in part is "" (interrupted), with no calibration."""
    daemon = Daemon(tmp_path, config=CONFIG.replace(RATE_CONFIG, '[history]\npolicy = "none"\n'))
    try:
        with Client(daemon.endpoint) as client:
            utt = client.speak(TEXT, session="conv", play=False, stream=True, max_audio_ms=4000)
            assert utt.wait().reason == "length"
            client.ack(utt.id, 1700, final=True)
            assert client.history("conv", wait=True) == [
                {"role": "assistant", "content": "", "interrupted": True, "response_id": utt.id}]
            assert client.status()["history"]["policy"] == "none"
    finally:
        daemon.close()


def test_a_streamed_reply_keeps_everything_received_as_its_text(daemon):
    """Streamed text: the turn's original text is every piece received, not the speak's first one;
    acks and the heard prefix work on it as on whole text."""
    pieces = ["Hel", "lo there, this", " is a test of", " the history, and it", " goes on for a while."]
    assert "".join(pieces) == TEXT
    with Client(daemon.endpoint) as client:
        utt = client.speak(pieces[0], more_text=True, session="s", play=False, stream=True, max_audio_ms=8000)
        for piece in pieces[1:]:
            utt.feed(piece)
        utt.end()
        assert utt.wait().reason == "length"
        client.ack(utt.id, 1700, final=True)
        cut = client.history("s", wait=True)
        again = client.speak(pieces[0], more_text=True, session="s2", play=False, stream=True, max_audio_ms=8000)
        for piece in pieces[1:]:
            again.feed(piece)
        again.end()
        again.wait()
        client.ack(again.id, 6000, final=True)
        long = client.history("s2", wait=True)
    assert cut == [{"role": "assistant", "content": expected_prefix(TEXT, 1700), "interrupted": True,
                    "response_id": utt.id}]
    assert long[0]["content"] == expected_prefix(TEXT, 6000) and len(long[0]["content"]) > len(pieces[0]) + 20


def test_a_filtered_stream_keeps_its_text_as_spoken(daemon):
    """A stream's reasoning and markdown (text_filter "llm", its default) are not in its turn: the
    heard prefix is cut from the spoken text."""
    pieces = ["<think>The user wants a", " test.</think>\n\n**Hel", "lo** there, this is a *test* of", " the `history`,",
              " and it goes on for a while."]
    with Client(daemon.endpoint) as client:
        utt = client.speak_iter(iter(pieces), session="f", play=False, stream=True, max_audio_ms=8000)
        assert utt.wait().reason == "length"
        client.ack(utt.id, 3000, final=True)
        turns = client.history("f", wait=True)
    assert turns == [{"role": "assistant", "content": expected_prefix(TEXT, 3000), "interrupted": True,
                      "response_id": utt.id}]


def test_a_stricter_final_ack_shortens_the_prefix(daemon):
    with Client(daemon.endpoint) as client:
        utt = client.speak(TEXT, session="c", play=False, stream=True, max_audio_ms=4000)
        utt.wait()
        client.ack(utt.id, 3000, final=True)
        long = client.history("c", wait=True)[-1]["content"]
        client.ack(utt.id, 1200, final=True)
        short = client.history("c", wait=True)[-1]["content"]
        client.ack(utt.id, 4000)  # an ordinary ack cannot undo a final one
        again = client.history("c", wait=True)[-1]["content"]
    assert long == expected_prefix(TEXT, 3000) and short == again == expected_prefix(TEXT, 1200)
    assert len(short) < len(long)


def test_a_rejected_duplicate_id_leaves_the_reply_it_duplicated_its_turn(daemon):
    """A second speak with the id of one in flight is rejected and leaves no turn; the first reply's
    turn still settles with its acks (the duplicate's reservation took back only its own slot)."""
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60000)
    sock.connect(daemon.endpoint)

    def send(**header) -> None:
        sock.send(msgpack.packb(header))

    def until(op: str) -> dict:
        while (reply := msgpack.unpackb(sock.recv()))["op"] != op:
            assert reply["op"] in ("accepted", "audio"), reply
        return reply

    try:
        send(op="speak", id="B", text=TEXT, more_text=True, session="dup", play=False, max_audio_ms=4000)
        until("accepted")
        send(op="speak", id="B", text="Another text.", session="dup", play=False)
        assert until("rejected")["reason"] == "duplicate id in flight"
        send(op="text", id="B", text="", final=True)
        assert until("done")["reason"] == "length"
        send(op="ack", id="B", played_ms=1700, final=True)
        send(op="history", session="dup", wait=True)
        turns = until("history")["turns"]
    finally:
        sock.close()
    assert turns == [{"role": "assistant", "content": expected_prefix(TEXT, 1700), "interrupted": True,
                      "response_id": "B"}]


def test_a_fully_played_finished_reply_keeps_its_whole_text(tmp_path, eos_artifact):
    """A reply that finishes (eos, on conftest's `eos_artifact`) and is heard to its end keeps its text."""
    art = eos_artifact[1]
    daemon = Daemon(tmp_path, config=CONFIG.replace("[history]", f'[daemon]\nartifact = "{art}"\n[history]'))
    try:
        with Client(daemon.endpoint) as client:
            utt = client.speak("Yes.", session="full", play=False, stream=True, max_audio_ms=4000)
            done = utt.wait()
            assert done.reason == "eos", done.report
            client.ack(utt.id, done.report["audio_ms"] / 2)  # a periodic ack on the way
            client.ack(utt.id, done.report["audio_ms"], final=True)
            turn = client.history("full", wait=True)[-1]
            status = client.status()["history"]
    finally:
        daemon.close()
    assert turn == {"role": "assistant", "content": "Yes.", "interrupted": False, "response_id": utt.id}
    assert status["calibrating"] == 0 and "(default)" in status["voice_ms_per_unit"]  # it learned the voice's rate


def test_history_survives_kill_9(tmp_path):
    first = Daemon(tmp_path, config=CONFIG)
    try:
        with Client(first.endpoint) as client:
            client.turn("k", "user", "Remember this.")
            utt = client.speak(TEXT, session="k", play=False, stream=True, max_audio_ms=2000)
            utt.wait()
            client.ack(utt.id, 1500, final=True)
            before = client.history("k", wait=True)
            client.turn("k", "user", "And this.")
            running = client.speak(TEXT, session="k", play=False, max_audio_ms=60000)  # still going at the kill
            client.history("k")  # every turn above is committed once the daemon answered this
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.close()
    (tmp_path / "again").mkdir()
    second = Daemon(tmp_path / "again", config=CONFIG, state=tmp_path / "state")
    try:
        with Client(second.endpoint) as client:
            after = client.history("k")
    finally:
        second.close()
    assert after[:2] == before and after[2] == {"role": "user", "content": "And this."}
    assert after[3] == {"role": "assistant", "content": "", "interrupted": True, "response_id": running.id}
    assert len(after) == 4


def test_the_asr_policy_hears_the_recorded_reply(tmp_path):
    """Through the daemon: the reply's audio is recorded while it is generated, and the heard part
    (the final ack's played_ms minus the guard) is what the transcription server receives."""
    import io
    import wave

    import numpy as np
    from support.transcription import Answer, transcription_server

    with transcription_server() as server:
        server.answer = Answer(body=b'{"text": "hello there this is a"}')
        config = CONFIG.replace('policy = "rate"', f'policy = "asr"\nasr_url = "{server.url}"\nasr_model = "m"')
        daemon = Daemon(tmp_path, config=config)
        try:
            with Client(daemon.endpoint) as client:
                utt = client.speak(TEXT, session="asr", play=False, stream=True, max_audio_ms=3000)
                utt.wait()
                client.ack(utt.id, 1500, final=True)
                turn = client.history("asr", wait=True)[-1]
        finally:
            daemon.close()
    assert turn == {"role": "assistant", "content": "Hello there, this is", "interrupted": True, "response_id": utt.id}
    (got,) = server.received
    with wave.open(io.BytesIO(got.wav)) as w:
        sent = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert len(sent) == (1500 - GUARD_MS) * 24  # 24 samples per ms
    assert np.abs(sent.astype(np.int32) - np.round(utt.pcm[:len(sent)] * 32767).astype(np.int32)).max() <= 1
