"""Enrolled voices through the real daemon on the built-in artifact (its clone encoder is the Base
twin's): enroll, speak, restart, speak again, remove; bad references and names; status.

What the daemon speaks with an enrolled voice is checked against offline synthesis of the same
reference (edged synth's path: the clone encoder, then a cloned request): the greedy frames are
equal. (That both equal qwen-tts's `generate_voice_clone` is tests/clone.)
"""

from __future__ import annotations

import time
import uuid

import msgpack
import numpy as np
import pytest
from support.daemon import Daemon

from edged.artifact import load_artifact
from edged.audio.wav import from_s16, to_s16
from edged.backends import make_backend
from edged.client import Client, RequestRejected
from edged.clone import VoiceEncoder, reference_pcm
from edged.protocol import ProtocolError
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

TEXT = "A voice enrolled once and kept."
REF_TEXT = "This is how I sound."
FRAMES = 12
GAP_FACTOR = 5
"""A chunk gap while a voice is encoded, against the longest without: the two cores are shared with the
encode (docs/dev/performance.md, "Voice cloning": the worst gap grows 1.4x on the tiny model; 1.2-3.3x here
on a loaded machine)."""


def reference_audio(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 15 * np.sin(2 * np.pi * 2.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(0.2 / k * np.sin(k * phase) for k in range(1, 5))
    return (voiced + 0.01 * np.random.default_rng(seed).standard_normal(len(t))).astype(np.float32)


def offline_frames(pcm: np.ndarray, rate: int, ref_text: str | None) -> np.ndarray:
    """What `edged synth --ref-audio` makes of this reference, sent as the client sends it (s16le)."""
    artifact = load_artifact(None)
    backend = make_backend("onnxruntime", 1)
    encoder = VoiceEncoder(artifact, backend)
    encoder.preallocate()
    s16 = from_s16(to_s16(pcm))
    voice = encoder.encode(reference_pcm(s16, rate, artifact.sample_rate, min_ms=1000, max_ms=30000), ref_text)
    request = SpeechRequest("o", TEXT, sampling=Sampling.greedy(), max_frames=FRAMES, clone=voice)
    return Synthesizer(artifact, backend).synthesize([request])[0].frames


def spoken(client: Client, voice: str) -> np.ndarray:
    return speak(client, voice)[0]


def speak(client: Client, voice: str) -> tuple[np.ndarray, np.ndarray]:
    """The greedy frames and PCM of TEXT in `voice`."""
    utt = client.speak(TEXT, voice=voice, play=False, stream=True, report_codes=True,
                       max_audio_ms=FRAMES * 80)
    done = utt.wait()
    assert done.reason == "length", done
    assert done.report["text_truncated"] is False  # a cloned voice's layout is the dual track, whole text included
    return np.asarray(done.report["rvq_codes"]), utt.pcm


def test_enroll_speak_restart_speak_remove(tmp_path):
    state = tmp_path / "state"
    xvec_pcm, icl_pcm = reference_audio(2.0, 24000, seed=1), reference_audio(3.0, 16000, seed=2)
    (tmp_path / "a").mkdir()
    daemon = Daemon(tmp_path / "a", state=state)
    try:
        with Client(daemon.endpoint) as client:
            added = client.voice_add("Me", xvec_pcm, 24000)
            assert added["name"] == "me" and added["mode"] == "xvector" and added["reference_ms"] == 2000
            icl = client.voice_add("me-icl", icl_pcm, 16000, ref_text=REF_TEXT)
            assert icl["mode"] == "icl" and icl["ref_text"] == REF_TEXT
            names = [(v["name"], v["kind"]) for v in client.voices()]
            assert ("vivian", "builtin") in names and names[-2:] == [("me", "enrolled"), ("me-icl", "enrolled")]
            first = {name: spoken(client, name) for name in ("me", "ME-icl")}
            first_pcm = speak(client, "me-icl")[1]
            assert client.status()["voices"]["enrolled"] == 2
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert np.array_equal(first["me"], offline_frames(xvec_pcm, 24000, None))
    assert np.array_equal(first["ME-icl"], offline_frames(icl_pcm, 16000, REF_TEXT))
    assert not np.array_equal(first["me"], first["ME-icl"])

    (tmp_path / "b").mkdir()
    daemon = Daemon(tmp_path / "b", state=state)  # the same state directory: the voices are kept
    try:
        with Client(daemon.endpoint) as client:
            assert [v["name"] for v in client.voices() if v["kind"] == "enrolled"] == ["me", "me-icl"]
            assert np.array_equal(spoken(client, "me"), first["me"])
            codes, pcm = speak(client, "me-icl")  # its vocoder state primed again by the voice thread
            assert np.array_equal(codes, first["ME-icl"]) and np.abs(pcm - first_pcm).max() <= 1e-5
            client.voice_remove("me")
            assert [v["name"] for v in client.voices() if v["kind"] == "enrolled"] == ["me-icl"]
            with pytest.raises(RequestRejected, match="unknown voice 'me'"):
                spoken(client, "me")
            with pytest.raises(ProtocolError, match="no enrolled voice 'me'"):
                client.voice_remove("me")
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    rows = stored_rows(state)
    assert [(r[0], r[1]) for r in rows] == [("me-icl", None)]  # the recording was not kept (voices.keep_reference)
    assert "enrolled voice" in (tmp_path / "a" / "daemon.log").read_text()
    assert str(REF_TEXT) not in (tmp_path / "a" / "daemon.log").read_text()  # nor the reference's text


def stored_rows(state) -> list[tuple]:
    """(name, reference) of every voice in the daemon's database (the state directory's)."""
    import sqlite3

    db = sqlite3.connect(str(state / "edged" / "voices.sqlite3"))
    try:
        return db.execute("SELECT name, reference FROM voices ORDER BY name").fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def voice_daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("voices"),
               config="[voices]\nmax_voices = 2\nmax_reference_ms = 5000\nkeep_reference = true\n")
    yield d
    d.close()


def test_bad_references_and_names_are_refused_with_reasons(voice_daemon):
    good = reference_audio(1.5, 24000)
    with Client(voice_daemon.endpoint) as client:
        refusals = [
            (lambda: client.voice_add("short", good[:12000], 24000), "reference is 500 ms long; a reference must be "
                                                                     "1000..5000 ms"),
            (lambda: client.voice_add("long", reference_audio(6.0, 24000), 24000), "reference is 6000 ms long"),
            (lambda: client.voice_add("rate", good, 1000), "sample_rate 1000 is outside"),
            (lambda: client.voice_add("quiet", np.zeros(36000, np.float32), 24000), "reference audio is silent"),
            (lambda: client.voice_add("vivian", good, 24000), "'vivian' is a built-in speaker"),
            (lambda: client.voice_add("no spaces", good, 24000), "voice name 'no spaces' is not valid"),
            (lambda: client.voice_add("x", good, 24000, ref_text="  "), "ref_text is empty"),
            (lambda: client.voice_remove("vivian"), "built-in speaker of this model: it cannot be removed"),
        ]
        for call, reason in refusals:
            with pytest.raises(ProtocolError, match=reason):
                call()
        # not audio: NaN samples (f32le), an empty frame, a frame of the wrong size
        def raw(header: dict, frame: bytes) -> str:
            id = uuid.uuid4().hex
            client._socket.send_multipart([msgpack.packb({"op": "voice_add", **header, "id": id}), frame])
            with pytest.raises(ProtocolError) as err:
                client._pump(lambda: False, "a raw voice_add")
            assert err.value.id == id
            return err.value.reason

        assert "non-finite" in raw({"name": "nan", "sample_rate": 24000, "samples": 24000, "format": "f32le"},
                                   np.full(24000, np.nan, np.float32).tobytes())
        assert "binary frame has 10 bytes, expected 48000" in raw(
            {"name": "size", "sample_rate": 24000, "samples": 24000, "format": "s16le"}, b"0123456789")
        assert "voice_add.samples must be an integer > 0" in raw(
            {"name": "empty", "sample_rate": 24000, "samples": 0, "format": "s16le"}, b"")
        client.voice_add("one", good, 24000)
        client.voice_add("two", good, 24000)
        with pytest.raises(ProtocolError, match="2 voices are enrolled, the most voices.max_voices allows"):
            client.voice_add("three", good, 24000)
        with pytest.raises(ProtocolError, match="voice 'one' exists: remove it first"):
            client.voice_add("One", good, 24000)
        status = client.status()["voices"]
        # 8 above, nan, three and One (the framing errors never reach the voice thread)
        assert status["state"] == "on" and status["enrolled"] == 2 and status["refused"] == 11
        assert spoken(client, "two").shape == (FRAMES, 4)  # and it serves on
    rows = stored_rows(voice_daemon.state)  # keep_reference = true: the recording as it came (s16le)
    assert [(name, len(ref)) for name, ref in rows] == [("one", 2 * len(good)), ("two", 2 * len(good))]


def test_an_artifact_without_a_clone_encoder_refuses_voice_ops(tmp_path, artifacts):
    """voice_add and voice_remove are refused; `voices` still lists the built-in speakers."""
    artifact = load_artifact(artifacts(0))
    daemon = Daemon(tmp_path, config=f'[daemon]\nartifact = "{artifact.path}"\n')
    try:
        with Client(daemon.endpoint) as client:
            assert client.voices() == [{"name": n, "kind": "builtin", **({"dialect": s.dialect} if s.dialect else {})}
                                       for n, s in sorted(artifact.speakers.items())]
            for call in (lambda: client.voice_remove("x"),
                         lambda: client.voice_add("x", reference_audio(1.5, 24000), 24000)):
                with pytest.raises(ProtocolError, match="this model cannot clone voices"):
                    call()
            status = client.status()
            assert status["voices"]["state"] == "off" and status["model"]["clone"] is False
            assert client.speak("Still speaking.", play=False, max_audio_ms=400).wait().reason == "length"
    finally:
        daemon.close()


def test_replies_keep_coming_while_a_voice_is_enrolled(tmp_path):
    """The voice thread encodes on engines of its own. A 400-frame reply is streamed while a 30 s
    reference is enrolled in context (the longest, and the costliest mode):
    1. chunks keep arriving through the encode, and no gap between two of them while the voice is
       encoded is longer than GAP_FACTOR x the pace: the longest gap between chunks of the same reply
       with nothing else going on, or of this one before the encode (a loop that waited for the
       encode would show one gap as long as the encode, 20 or more of those);
    2. the reply makes the frames and PCM of the same reply with nothing else going on.
    (How much the shared CPU slows it: docs/dev/performance.md, "Voice cloning", scripts/bench/clone.py.)"""
    import threading

    before = 10  # chunks before the enrollment is sent
    daemon = Daemon(tmp_path)
    try:
        with Client(daemon.endpoint, timeout_s=120) as speaker, Client(daemon.endpoint, timeout_s=120) as enroller:
            alone = speaker.speak(TEXT, play=False, stream=True, max_audio_ms=400 * 80, report_codes=True)
            alone_arrivals = chunk_arrivals(alone, threading.Event(), before)
            utt = speaker.speak(TEXT, play=False, stream=True, max_audio_ms=400 * 80, report_codes=True)
            paced = threading.Event()
            arrivals: list[float] = []
            reader = threading.Thread(target=lambda: arrivals.extend(chunk_arrivals(utt, paced, before)))
            reader.start()
            assert paced.wait(timeout=120), "no audio in 120 s"
            sent = time.monotonic()
            enroller.voice_add("long", reference_audio(30.0, 24000), 24000, ref_text=REF_TEXT)
            added = time.monotonic()
            reader.join(timeout=120)
            assert not reader.is_alive(), "the reply did not end"
    finally:
        daemon.close()
    assert utt.done is not None and alone.done is not None and utt.done.report["frames"] == 400
    assert utt.done.report["rvq_codes"] == alone.done.report["rvq_codes"] and np.array_equal(utt.pcm, alone.pcm)
    t = np.array(arrivals)
    gaps = np.diff(t)
    pace = max(np.diff(alone_arrivals)[1:].max(), gaps[1:before - 1].max())  # the first chunk is one frame
    spanning = gaps[(t[1:] > sent) & (t[:-1] < added)]  # every gap that overlaps the encode
    assert len(spanning) >= 3, (len(spanning), added - sent)  # the reply ran while the voice was encoded
    assert spanning.max() <= GAP_FACTOR * pace, (spanning.max(), pace, added - sent)


def chunk_arrivals(utt, started, after: int) -> list[float]:
    """When each audio chunk of `utt` arrived (monotonic s), reading it to its end; `started` is set
    once `after` chunks have come."""
    arrivals: list[float] = []
    for event in utt:
        if type(event).__name__ == "Audio":
            arrivals.append(time.monotonic())
            if len(arrivals) == after:
                started.set()
    return arrivals
