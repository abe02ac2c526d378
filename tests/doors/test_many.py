"""Many clients at once, through both front doors: each gets exactly its own audio."""

from __future__ import annotations

import asyncio
import threading

import openai
from support.doors import read_reply
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

REQUESTS = [("Good morning, kitchen.", "aiden"), ("The oven is ready.", "serena"), ("Lights off in five.", "ryan"),
            ("Someone is at the door.", "vivian"), ("Rain expected at noon.", "default"), ("Timer done.", "dylan")]


def test_concurrent_http_and_wyoming_clients_each_get_their_own_audio(front):
    got: dict[int, bytes] = {}

    def over_http(i: int) -> None:
        text, voice = REQUESTS[i]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.http.port}/v1", api_key=front.api_key,
                               max_retries=0, timeout=120)
        got[i] = client.audio.speech.create(model="tts-1", voice=voice, input=text, response_format="pcm").read()

    async def over_wyoming(i: int) -> None:
        text, voice = REQUESTS[i]
        async with AsyncTcpClient("127.0.0.1", front.wyoming.port) as client:
            await client.write_event(Synthesize(text, voice=SynthesizeVoice(name=voice)).event())
            types, got[i], _ = await read_reply(client)
            assert types[-1] == "audio-stop", types

    async def wyoming_clients() -> None:
        await asyncio.wait_for(asyncio.gather(*(over_wyoming(i) for i in range(1, len(REQUESTS), 2))), 300)

    threads = [threading.Thread(target=over_http, args=(i,)) for i in range(0, len(REQUESTS), 2)]
    threads.append(threading.Thread(target=asyncio.run, args=(wyoming_clients(),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(len(REQUESTS)))
    for i, (text, voice) in enumerate(REQUESTS):
        assert got[i] == front.reference(text, voice=None if voice == "default" else voice), (i, text, voice)
