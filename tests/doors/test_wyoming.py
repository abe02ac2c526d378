"""`edged wyoming` through the `wyoming` package's own client, against the real daemon."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from support.doors import read_reply, wyoming
from wyoming.audio import AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from edged.client import Client

TEXT = "Hello from the front door."


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_describe_lists_every_voice_with_its_languages(front):
    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    info = run(describe())
    (program,) = info.tts
    assert program.name == "edged" and program.installed and program.supports_synthesize_streaming
    voices = {v.name: v.languages for v in program.voices}
    assert list(voices) == ["default", "aiden", "dylan", "eric", "ryan", "serena", "vivian"]
    assert voices["default"] == ["de", "en", "es", "fr", "it", "ja", "ko", "pt", "ru", "zh"]
    assert voices["dylan"] == ["zh"] and voices["eric"] == ["zh"]  # dialect speakers
    with Client(front.daemon.endpoint) as client:  # what the door read them from
        model = client.status()["model"]
        assert {k: model[k] for k in ("type", "sample_rate", "instruct", "speakers", "languages")} == {
            "type": "custom_voice", "sample_rate": 24000, "instruct": True,
            "speakers": ["aiden", "dylan", "eric", "ryan", "serena", "vivian"],
            "languages": ["beijing_dialect", "chinese", "english", "french", "german", "italian", "japanese",
                          "korean", "portuguese", "russian", "sichuan_dialect", "spanish"]}


@pytest.mark.parametrize("voice,speak", [
    (SynthesizeVoice(name="Aiden"), {"voice": "aiden"}),
    (SynthesizeVoice(language="en-US"), {"language": "english"}),  # a voice by language alone: no name
    (None, {}),
])
def test_synthesize_streams_exactly_the_daemons_audio(front, voice, speak):
    async def synthesize() -> tuple[list[str], bytes, list]:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Synthesize(TEXT, voice=voice).event())
            return await read_reply(client)

    types, audio, events = run(synthesize())
    assert types[0] == "audio-start" and types[-1] == "audio-stop" and set(types[1:-1]) == {"audio-chunk"}
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    assert len(types) > 3  # chunk by chunk, as the daemon streams them
    assert audio == front.reference(TEXT, **speak)


def test_streamed_text_is_spoken_as_it_comes(front):
    """Audio comes before synthesize-stop (the daemon speaks the text it has), and the whole reply
    equals the daemon's own streamed-text reply; the compatibility `synthesize` inside the stream is
    ignored."""
    pieces = ["Hello from ", "the front ", "door."]

    async def stream() -> tuple[list[str], bytes]:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="ryan")).event())
            await client.write_event(SynthesizeChunk(pieces[0]).event())
            first = await read_reply(client, until="audio-chunk")  # nothing final has been sent yet
            assert first[0] == ["audio-start", "audio-chunk"], first[0]
            for piece in pieces[1:]:
                await client.write_event(SynthesizeChunk(piece).event())
            await client.write_event(Synthesize("".join(pieces), voice=SynthesizeVoice(name="ryan")).event())
            await client.write_event(SynthesizeStop().event())
            rest = await read_reply(client, until="synthesize-stopped")
            return first[0] + rest[0], first[1] + rest[1]

    types, audio = run(stream())
    assert types[-2:] == ["audio-stop", "synthesize-stopped"] and types.count("audio-start") == 1
    assert audio == front.reference(pieces, voice="ryan")


@pytest.mark.parametrize("voice,wanted,code", [
    (SynthesizeVoice(name="alloy"), "unknown voice 'alloy' (this model's voices: default, aiden, dylan, eric, ryan",
     "rejected"),
    (SynthesizeVoice(language="tlh"), "unknown language 'tlh' (this model's languages: zh (beijing_dialect)",
     "bad-request"),
])
def test_a_voice_or_language_the_model_lacks_is_an_error_event(front, voice, wanted, code):
    async def synthesize() -> list:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Synthesize(TEXT, voice=voice).event())
            types, _, events = await read_reply(client)
            # the connection still serves
            await client.write_event(Describe().event())
            assert (await client.read_event()).type == "info"
            return events

    events = run(synthesize())
    assert [e.type for e in events] == ["error"]
    assert Error.from_event(events[0]).text.startswith(wanted) and Error.from_event(events[0]).code == code


def test_a_busy_daemon_is_an_error_event(front):
    async def synthesize() -> list:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Synthesize(TEXT).event())
            return (await read_reply(client))[2]

    with front.busy():
        (event,) = run(synthesize())
    assert Error.from_event(event).text.startswith("rejected: busy") and Error.from_event(event).code == "rejected"


def test_a_client_that_disconnects_cancels_its_request(front):
    before = front.done_count("cancelled")

    async def hang_up() -> None:
        client = AsyncTcpClient("127.0.0.1", front.wyoming.port)
        await client.connect()
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(TEXT).event())  # never final: only a cancel ends it
        await read_reply(client, until="audio-chunk")
        await client.disconnect()

    run(hang_up())
    deadline = asyncio.run(_wait_for(lambda: front.done_count("cancelled") > before))
    assert deadline, "the daemon's request was not cancelled"


async def _wait_for(condition, timeout: float = 30) -> bool:
    for _ in range(int(timeout / 0.1)):
        if condition():
            return True
        await asyncio.sleep(0.1)
    return False


def test_play_local_plays_on_the_daemons_speaker_and_sends_no_audio(front, tmp_path):
    """--play-local: the daemon plays it (here: no sound card, so "silent"), the Wyoming client gets
    audio-start and, once played, audio-stop, with no chunks."""
    door = wyoming(tmp_path, front.daemon.endpoint, "--play-local")
    try:
        async def synthesize() -> list[str]:
            async with AsyncTcpClient("127.0.0.1", door.port) as client:
                await client.write_event(Synthesize(TEXT).event())
                return (await read_reply(client))[0]

        before = front.done_count("eos") + front.done_count("length")
        assert run(synthesize()) == ["audio-start", "audio-stop"]
        assert front.done_count("eos") + front.done_count("length") == before + 1
    finally:
        assert door.close() == 0, door.read_log()


def test_zeroconf_advertises_the_service_for_home_assistant(front, tmp_path):
    """Found by a real mDNS browser, as Home Assistant finds wyoming-piper: _wyoming._tcp, its port."""
    from zeroconf import IPVersion, ServiceBrowser, ServiceListener, Zeroconf

    name = f"edged-test-{os.getpid()}"
    door = wyoming(tmp_path, front.daemon.endpoint, "--zeroconf", name)
    found: list[tuple[str, int, list[str]]] = []

    class Listener(ServiceListener):
        def add_service(self, zc, type_, name):
            info = zc.get_service_info(type_, name, timeout=3000)
            if info is not None:
                found.append((name, info.port, info.parsed_addresses()))

        def update_service(self, zc, type_, name):
            pass

        def remove_service(self, zc, type_, name):
            pass

    zc = Zeroconf(ip_version=IPVersion.V4Only)
    try:
        ServiceBrowser(zc, "_wyoming._tcp.local.", Listener())
        for _ in range(150):
            if any(service.startswith(f"{name}.") for service, _, _ in found):
                break
            asyncio.run(asyncio.sleep(0.1))
    finally:
        zc.close()
        assert door.close() == 0, door.read_log()
    assert (f"{name}._wyoming._tcp.local.", door.port, ["127.0.0.1"]) in found, found


def test_an_enrolled_voice_is_described_and_speaks_streamed_text_whole(front):
    """A voice enrolled in context shows up in `info` at once; its streamed text is gathered and
    spoken at synthesize-stop (it takes only whole text), equal to the daemon's whole-text reply; an
    LLM's reasoning and markdown in it are not spoken, as in streamed text."""
    t = np.arange(2 * 24000) / 24000
    reference = (0.3 * np.sin(2 * np.pi * (140 + 40 * np.sin(2 * np.pi * 3 * t)) * t)).astype(np.float32)
    pieces = ["<think>Greet them.</think>**Hello** from ", "the *front* ", "door."]

    async def describe_and_stream() -> tuple[Info, list[str], bytes]:
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="grandma")).event())
            for piece in pieces:
                await client.write_event(SynthesizeChunk(piece).event())
            await client.write_event(SynthesizeStop().event())
            types, audio, _ = await read_reply(client, until="synthesize-stopped")
            return info, types, audio

    with Client(front.daemon.endpoint, timeout_s=120) as client:
        client.voice_add("grandma", reference, 24000, ref_text="A short reference.")
    try:
        info, types, audio = run(describe_and_stream())
        described = {v.name: v for v in info.tts[0].voices}["grandma"]
        assert described.description == "grandma: enrolled voice (icl)" and "en" in described.languages
        assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
        assert audio == front.reference("Hello from the front door.", voice="grandma")
    finally:
        with Client(front.daemon.endpoint) as client:
            client.voice_remove("grandma")
