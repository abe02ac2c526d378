"""The microphone's switches through the real daemon on its own JACK server: `audio.barge_in = false`
keeps the VAD and its events but never cuts a reply; `vad.echo_cancel = false` feeds the VAD the
raw microphone. The rig is test_daemon_audio's (tests/support/patchbay.py), on a JACK server of
this module's own."""

from __future__ import annotations

import time

import pytest
from support.patchbay import audio_rig

TEXT = "Hello there, this is a test of the speaker, and it goes on for a while."


@pytest.fixture(scope="module")
def rig(jack_server, tmp_path_factory):
    with audio_rig(jack_server.name, tmp_path_factory.mktemp("audio-options"),
                   "barge_in = false\n[vad]\necho_cancel = false\n") as rig:
        yield rig


def test_without_barge_in_user_speech_is_heard_but_never_cuts_the_reply(rig):
    daemon, bay, sub, client, speech = rig
    bay.patch(record=True, voice=True)
    time.sleep(0.5)
    sub.clear()
    utt = client.speak(TEXT, stream=True, max_audio_ms=5000)
    time.sleep(1.0)
    bay.say(speech)
    done = utt.wait()
    assert done.reason == "length" and done.report["played_ms"] == done.report["audio_ms"]
    deadline = time.monotonic() + 5
    while not [e for e in sub.of("vad") if e["state"] == "stop"]:  # the VAD's stop after the speech ends
        assert time.monotonic() < deadline, sub.of("vad")
        time.sleep(0.05)
    states = [e["state"] for e in sub.of("vad")]
    assert states[:2] == ["start", "stop"] and sub.of("vad")[0]["while_playing"]
    assert sub.of("barge_in") == []
    status = client.status()["audio"]["input"]
    assert status["barge_in"] is False and status["barge_ins"] == 0 and status["speech_starts"] >= 1
    assert status["echo_cancel"] is False


def test_voice_add_records_the_daemons_own_microphone(rig, capsys):
    """`edged voice add NAME --record S`: S seconds of the `mic` events (16 kHz, as the daemon hears
    its microphone) become the reference of an enrolled voice (the built-in artifact has a clone
    encoder); the daemon refuses a silent one, so an enrolled voice means the speech came through.
    The event socket is the one the daemon's status names."""
    import json

    from edged.cli import main

    daemon, bay, sub, client, speech = rig
    bay.patch(record=False, voice=True)
    bay.say(speech)
    code = main(["voice", "add", "from-the-mic", "--record", "1.5", "--endpoint", daemon.endpoint])  # events: from status
    out = capsys.readouterr()
    assert code == 0, out.err
    voice = json.loads(out.out)
    assert voice["name"] == "from-the-mic" and voice["mode"] == "xvector" and voice["reference_ms"] == 1500
    assert any(v["name"] == "from-the-mic" for v in client.voices())
    client.voice_remove("from-the-mic")
