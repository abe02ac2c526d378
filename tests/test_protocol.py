"""Protocol v1: every op round-trips, and every malformed message gets a reason naming what was wrong.
The client library is tested in test_client.py."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from support.wire import pack, speak_header

from edged import protocol
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

# --- round trips

REQUESTS = [
    Speak(id="r1", text="hello"),
    Speak(id=7, text="hello", more_text=True, session="s", voice="vivian", language="english", instruct="calm",
          play=False, stream=True, format="s16le", max_audio_ms=5000,
          sampling={"temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1,
                    "cp_temperature": 0.5, "cp_top_k": 10, "cp_top_p": 1, "seed": 3},
          report_codes=True),
    Speak(id="x" * protocol.MAX_ID_CHARS, text="", sampling={"seed": None}),
    Speak(id="r2", text="**Hi**", more_text=True, text_filter="none"),
    Speak(id="r3", text="**Hi**", text_filter="llm"),
    Text(id="r1", text="more"),
    Text(id="r1", text="", final=True),
    Cancel(id="r1"),
    Cancel(id=-(2**63), any_client=True),
    Ack(id="r1", played_ms=0),
    Ack(id="r1", played_ms=1234.5, final=True),
    Turn(session="s", role="user", content="hi there"),
    Turn(session="s", role="system", content="be brief"),
    Turn(session="s", role="assistant", content="ok"),
    History(session="s"),
    History(session="s", wait=True),
    History(session="s", wait=True, close=True),
    Status(),
    protocol.VoiceRemove(name="me"),
    protocol.VoiceRemove(name="me", id="v1"),
    protocol.Voices(),
    protocol.Voices(id=3),
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
    (protocol.VoiceAdded(name="me", voice={"name": "me", "kind": "enrolled", "mode": "icl"}, id="v1"), None),
    (protocol.VoiceRemoved(name="me"), None),
    (protocol.VoicesReply(voices=[{"name": "vivian", "kind": "builtin"}], id=3), None),
]


@pytest.mark.parametrize("msg", REQUESTS, ids=lambda m: m.op)
def test_request_round_trip(msg):
    frames = encode(msg)
    assert len(frames) == 1
    assert decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES) == (msg, None)


@pytest.mark.parametrize("msg,pcm", REPLIES, ids=lambda m: getattr(m, "op", "pcm"))
def test_reply_round_trip(msg, pcm):
    frames = encode(msg, pcm)
    assert len(frames) == (1 if pcm is None else 2)
    assert decode_reply(frames) == (msg, pcm)


def test_voice_add_carries_its_recording():
    pcm = np.array([0, 100, -100], "<i2").tobytes()
    msg = protocol.VoiceAdd(name="me", sample_rate=16000, samples=3, format="s16le", ref_text="hi", id="v1")
    frames = encode(msg, pcm)
    assert decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES) == (msg, pcm)
    with pytest.raises(ProtocolError, match=r"voice_add: binary frame has 4 bytes, expected 6 \(3 samples of s16le\)"):
        decode([frames[0], b"0000"], max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
    with pytest.raises(ProtocolError, match=r"voice_add: missing the binary frame \(3 samples of s16le\)"):
        decode([frames[0]], max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)


def test_every_op_has_a_round_trip():
    assert {m.op for m in REQUESTS} | {"voice_add"} == set(protocol.REQUESTS)
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
    assert decode(pack(speak_header(voice=None, max_audio_ms=None))) == (Speak(id="r1", text="hi"), None)


OPTIONAL = sorted(op for op, cls in protocol.REQUESTS.items()
                  if any(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                         for f in dataclasses.fields(cls)))


@pytest.mark.parametrize("op", OPTIONAL)
def test_nil_is_the_default_of_every_optional_field(op):
    """docs/protocol.md: "An optional field may be absent or nil; both mean its default" (sampling's
    keys too)."""
    cls = protocol.REQUESTS[op]
    fields = dataclasses.fields(cls)
    required = {f.name: REQUIRED_VALUES[f.name] for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    optional = [f.name for f in fields if f.name not in required]
    header = {"op": op, **required, **dict.fromkeys(optional)}
    blob = b"\0" * 4 if op == "voice_add" else None
    frames = pack(header) + ([blob] if blob else [])
    assert decode(frames) == (cls(**required), blob)
    if op == "speak":
        nil_keys = pack(speak_header(sampling=dict.fromkeys(protocol.SAMPLING_KEYS)))
        assert decode(nil_keys)[0].sampling == dict.fromkeys(protocol.SAMPLING_KEYS)


REQUIRED_VALUES = {"id": "r1", "text": "hi", "session": "s", "role": "user", "content": "c", "name": "me",
                   "samples": 1, "sample_rate": 24000, "played_ms": 80.0}
"""A valid value of each request field that has no default."""


def test_every_request_op_with_optional_fields_is_covered():
    assert set(OPTIONAL) >= {"speak", "text", "ack", "history", "voice_add", "voices", "voice_remove"}


def test_sampling_keys_are_the_runtime_keys():
    assert set(protocol.SAMPLING_KEYS) == {f.name for f in dataclasses.fields(Sampling)}


def test_encode_checks_like_decode():
    with pytest.raises(ProtocolError, match=r"speak.format must be one of 'f32le', 's16le', got str 'wav'"):
        encode(Speak(id="r1", text="a", format="wav"))
    with pytest.raises(ProtocolError, match="unexpected binary frame: speak carries none"):
        encode(Speak(id="r1", text="a"), b"\0\0")
    with pytest.raises(ProtocolError, match="audio: missing the binary frame"):
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
    (pack({"op": "speek", "id": "r1"}),
     "unknown op 'speek' (known: speak, text, cancel, ack, turn, history, status, voice_add, voice_remove, voices)",
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
    (pack(speak_header(text_filter="markdown")),
     "speak.text_filter must be one of 'llm', 'none', or nil, got str 'markdown'", "r1"),
    (pack(speak_header(text_filter=True)), "speak.text_filter must be one of 'llm', 'none', or nil, got bool", "r1"),
    (pack(speak_header(context={"role": "user"})), "speak.context must be an array, got map", "r1"),
    (pack(speak_header(context=[{"role": "bot", "content": "x"}])),
     "speak.context[0].role must be one of 'user', 'system', 'assistant', got str 'bot'", "r1"),
    (pack(speak_header(context=[{"role": "user"}])), "speak.context[0]: missing key 'content'", "r1"),
    (pack(speak_header(context=[{"role": "user", "content": "x", "media": []}])),
     "speak.context[0]: unknown key 'media'", "r1"),
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
    (pack({"op": "turn", "session": None, "role": "user", "content": "c"}), "turn.session must be a non-empty string, got nil",
     None),
    (pack({"op": "history", "session": "s", "wait": "true"}), "history.wait must be a bool", None),
    (pack({"op": "turn", "session": "", "role": "user", "content": "c"}),
     "turn.session must be a non-empty string, got str ''", None),
    (pack({"op": "history", "session": ""}), "history.session must be a non-empty string", None),
    # unknown fields
    (pack(speak_header(voise="vivian")), "speak: unknown field 'voise' (fields: id, text, more_text,", "r1"),
    (pack({"op": "status", "verbose": True}), "status: unknown field 'verbose' (fields: none)", None),
    (pack({"op": "status", "id": "q"}), "status: unknown field 'id'", "q"),
    (pack({"op": "turn", "session": "s", "role": "user", "content": "c", "id": 5}), "turn: unknown field 'id'", 5),
    # frames
    (pack(speak_header()) + [b"\0\0\0\0"], "unexpected binary frame: speak carries none", "r1"),
    (pack({"op": "status"}) + [b""], "unexpected binary frame: status carries none", None),
    (pack(speak_header()) + [b"a", b"b"], "too many frames: 3", "r1"),
    # media: the frame is there exactly when the header says, with the size it says
    (pack(speak_header(media={"dtype": "float16", "shape": [2, 3]})), "speak: missing the binary frame "
     "(media float16 [2, 3])", "r1"),
    (pack(speak_header(media={"dtype": "float16", "shape": [2, 3]})) + [b"\0" * 24],
     "speak: binary frame has 24 bytes, expected 12 (media float16 [2, 3])", "r1"),
    (pack(speak_header(media={"dtype": "float64", "shape": [2, 3]})) + [b"\0" * 48],
     "speak.media.dtype must be one of 'float16', 'float32', got str 'float64'", "r1"),
    (pack(speak_header(media={"dtype": "float32", "shape": [6]})) + [b"\0" * 24],
     "speak.media.shape must be [rows, width], two integers > 0, got [6]", "r1"),
    (pack(speak_header(media={"dtype": "float32", "shape": [0, 3]})) + [b""],
     "speak.media.shape must be [rows, width], two integers > 0, got [0, 3]", "r1"),
    (pack(speak_header(media={"dtype": "float32", "shape": "2x3"})) + [b"\0" * 24],
     "speak.media.shape must be [rows, width], two integers > 0, got str '2x3'", "r1"),
    (pack(speak_header(media={"dtype": "float32", "shape": [2, 3], "order": "C"})) + [b"\0" * 24],
     "speak.media: unknown key 'order' (known: dtype, shape)", "r1"),
    (pack(speak_header(media=[2, 3])) + [b"\0" * 24], "speak.media must be a map, got array", "r1"),
]


def test_speak_with_media_carries_its_frame():
    hidden = np.arange(6, dtype="<f2").reshape(2, 3)
    msg = Speak(id="r1", text="hi", context=[{"role": "user", "content": "look"}],
                media={"dtype": "float16", "shape": [2, 3]})
    frames = encode(msg, memoryview(hidden).cast("B"))
    assert len(frames) == 2
    assert decode(frames) == (msg, hidden.tobytes())


@pytest.mark.parametrize("frames,reason,id", MALFORMED, ids=lambda x: None)
def test_malformed_request_names_what_is_wrong(frames, reason, id):
    with pytest.raises(ProtocolError) as e:
        decode(frames, max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
    assert reason in e.value.reason
    assert e.value.id == id and type(e.value.id) is type(id)


def test_oversized_is_rejected_before_unpacking(monkeypatch):
    def unpack(*args, **kwargs):
        raise AssertionError("unpacked an oversized message")

    monkeypatch.setattr(protocol.msgpack, "unpackb", unpack)
    blob = b"\x00" * (64 << 20)
    with pytest.raises(ProtocolError, match=r"message too large: 67108864 bytes \(max 2097152\)"):
        decode([blob], max_bytes=protocol.DEFAULT_MAX_MESSAGE_BYTES)
    # all frames count, and the limit is the caller's
    with pytest.raises(ProtocolError, match=r"message too large: 1001 bytes \(max 1000\)"):
        decode([b"\x80" * 500, b"\x00" * 501], max_bytes=1000)


def test_max_bytes_is_inclusive():
    frames = pack(speak_header(text="a" * 100))
    assert decode(frames, max_bytes=len(frames[0]))[0].text == "a" * 100
    with pytest.raises(ProtocolError, match="too large"):
        decode(frames, max_bytes=len(frames[0]) - 1)


def test_requests_are_not_replies_and_replies_are_not_requests():
    with pytest.raises(ProtocolError, match="unknown op 'speak'"):
        decode_reply(encode(Speak(id="r1", text="a")))
    with pytest.raises(ProtocolError, match="unknown op 'done'"):
        decode(encode(Done(id="r1", reason="eos")))


MALFORMED_REPLIES = [
    (pack({"op": "audio", "id": "r1", "seq": 0, "sample_rate": 24000, "format": "f32le", "first_sample": 0,
           "samples": 2}), "audio: missing the binary frame"),
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
