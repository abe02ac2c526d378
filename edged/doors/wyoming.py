"""`edged wyoming`: the daemon as a Wyoming text-to-speech service (Home Assistant's local voice
protocol), on the `wyoming` package's server and events.

- `describe` -> `info`: one TTS program, "edged", with a voice per built-in speaker and enrolled voice
  (and "default", the model's default), each with its language codes.
- `synthesize` -> `audio-start` (when the daemon accepts), an `audio-chunk` per chunk the daemon
  streams (16-bit mono at the model's rate), `audio-stop` when it is done; a refusal or failure is
  an `error` event instead.
- `synthesize-start`, `synthesize-chunk`..., `synthesize-stop` -> one speak with its text streamed
  (`more_text`), started by the first chunk; the reply ends with `audio-stop` and `synthesize-stopped`.
  (The `synthesize` a client sends inside a stream, for older servers, is ignored.) A voice cloned in
  context needs its whole text: its chunks are gathered and spoken at `synthesize-stop`.
- The daemon's `play` is false (the Wyoming client plays the audio) unless `play_local`: then the
  daemon plays it on its own speaker and the client gets `audio-start` and, once it has played,
  `audio-stop`, with no chunks.
- A client that disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error as WyomingError
from wyoming.event import Event as WyomingEvent
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from edged import __version__
from edged.client import Audio
from edged.doors.link import DaemonDown, DaemonLink, Speech
from edged.doors.offer import DEFAULT_VOICE, OfferCache, UnknownChoice, speak_voice, streams_text, unknown_voice
from edged.protocol import Accepted, Done, ProtocolError, Rejected

log = logging.getLogger(__name__)

WIDTH, CHANNELS = 2, 1  # s16le mono
ATTRIBUTION = Attribution(name="edged (Qwen3-TTS)", url="https://github.com/QwenLM/Qwen3-TTS")


class WyomingDoor:
    """What every connection shares: the link to the daemon and the model's offer."""

    def __init__(self, link: DaemonLink, *, play_local: bool = False):
        self.link = link
        self.offers = OfferCache(link)
        self.play_local = play_local

    async def info(self) -> Info:
        model, listed = await self.offers.model(), await self.offers.voices(fresh=True)
        voices = [TtsVoice(name=DEFAULT_VOICE, description=f"the model's default voice ({model.type})",
                           attribution=ATTRIBUTION, installed=True, version=None, languages=model.codes())]
        for v in listed:
            what = "built-in speaker" if v["kind"] == "builtin" else f"enrolled voice ({v['mode']})"
            voices.append(TtsVoice(name=v["name"], description=f"{v['name']}: {what}", attribution=ATTRIBUTION,
                                   installed=True, version=None, languages=model.codes(v)))
        program = TtsProgram(name="edged", description="edged: on-device Qwen3 speech", attribution=ATTRIBUTION,
                             installed=True, version=__version__, voices=voices, supports_synthesize_streaming=True)
        return Info(tts=[program])

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Handler:
        return Handler(reader, writer, self)


class Handler(AsyncEventHandler):
    """One Wyoming connection: one synthesis at a time, its audio written as the daemon streams it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, door: WyomingDoor):
        super().__init__(reader, writer)
        self.door = door
        self.reply: asyncio.Task | None = None
        """The running synthesis: reads the daemon's replies, writes audio events."""
        self.stream: dict[str, Any] | None = None
        """Inside synthesize-start ... synthesize-stop: {voice, language, text (held back), speech}."""

    async def handle_event(self, event: WyomingEvent) -> bool:
        if Describe.is_type(event.type):
            try:
                await self.write_event((await self.door.info()).event())
            except (DaemonDown, ProtocolError) as exc:
                await self._error(str(exc), "daemon-unavailable")
            return True
        if Synthesize.is_type(event.type):
            if self.stream is None:  # inside a stream it is a copy for older servers: ignored
                synthesize = Synthesize.from_event(event)
                await self._start(synthesize.text, synthesize.voice, streamed=False)
            return True
        if SynthesizeStart.is_type(event.type):
            await self._finish_previous()
            self.stream = {"voice": SynthesizeStart.from_event(event).voice, "text": "", "speech": None}
            return True
        if SynthesizeChunk.is_type(event.type) and self.stream is not None:
            await self._chunk(SynthesizeChunk.from_event(event).text)
            return True
        if SynthesizeStop.is_type(event.type) and self.stream is not None:
            await self._stop()
            return True
        return True  # events of other services: not ours

    async def disconnect(self) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.cancel()  # its finally cancels the daemon's request
            await asyncio.gather(self.reply, return_exceptions=True)

    # --- streamed text

    async def _chunk(self, text: str) -> None:
        assert self.stream is not None
        speech = self.stream["speech"]
        if speech is not None:
            if not (speech.finished or speech.cancelling):  # refused or ended: the rest goes nowhere
                await speech.text(text)
            return
        self.stream["text"] += text
        if self.stream["text"].strip() and await self._streams(self.stream["voice"]):
            self.stream["speech"] = await self._start(self.stream["text"], self.stream["voice"], streamed=True,
                                                     more_text=True)

    async def _stop(self) -> None:
        assert self.stream is not None
        stream, self.stream = self.stream, None
        if stream["speech"] is not None:
            if not (stream["speech"].finished or stream["speech"].cancelling):
                await stream["speech"].text("", final=True)
        elif stream["text"].strip():  # held back (a voice cloned in context), or a stream of one chunk
            await self._start(stream["text"], stream["voice"], streamed=True)
        else:
            await self.write_event(SynthesizeStopped().event())

    async def _streams(self, voice: SynthesizeVoice | None) -> bool:
        name = speak_voice(voice.name if voice else None)
        try:
            return name is None or streams_text(await self.door.offers.voices(), name)
        except (DaemonDown, ProtocolError):
            return True  # the speak itself will be refused, with the reason

    # --- one synthesis

    async def _start(self, text: str, voice: SynthesizeVoice | None, *, streamed: bool,
                     more_text: bool = False) -> Speech | None:
        """Send the speak and start writing its reply; None (and an `error` event) when it cannot be sent."""
        await self._finish_previous()
        try:
            model = await self.door.offers.model()
            fields = {"voice": speak_voice(voice.name if voice else None),
                      "language": model.language(voice.language if voice else None)}
            play = self.door.play_local
            speech = await self.door.link.speak(text, more_text=more_text, format="s16le", play=play, stream=not play,
                                                text_filter="llm" if streamed else None, **fields)
        except UnknownChoice as exc:
            await self._error(str(exc), "bad-request", streamed)
            return None
        except (DaemonDown, ProtocolError) as exc:
            await self._error(str(exc), "daemon-unavailable", streamed)
            return None
        self.reply = asyncio.create_task(self._write_reply(speech, model.sample_rate, streamed, fields["voice"]))
        return speech

    async def _finish_previous(self) -> None:
        if self.reply is not None:
            await asyncio.gather(self.reply, return_exceptions=True)
            self.reply = None

    async def _write_reply(self, speech: Speech, rate: int, streamed: bool, voice: str | None) -> None:
        try:
            async for event in speech:
                if isinstance(event, Accepted):
                    await self.write_event(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
                elif isinstance(event, Audio):
                    await self.write_event(AudioChunk(rate=rate, width=WIDTH, channels=CHANNELS,
                                                      audio=event.pcm.tobytes()).event())
                elif isinstance(event, Rejected):
                    await self._error(await self._refusal(event.reason, voice), "rejected", streamed)
                    return
                elif isinstance(event, Done):
                    if event.reason == "error":
                        await self._error(f"failed: {event.error or 'error'}", "failed", streamed)
                        return
                    await self.write_event(AudioStop().event())
            if streamed:
                await self.write_event(SynthesizeStopped().event())
        except (DaemonDown, ProtocolError) as exc:
            await self._error(str(exc), "daemon-unavailable", streamed)
        except (ConnectionError, OSError) as exc:
            log.info("wyoming client gone (%s): cancelling %s", exc, speech.id)
        finally:
            await speech.cancel()

    async def _refusal(self, reason: str, voice: str | None) -> str:
        """The daemon's reason, or for an unknown voice the whole list of voices (enrolled ones too)."""
        if voice is not None and reason.startswith("unknown voice"):
            return str(unknown_voice(voice, await self.door.offers.voices(fresh=True)))
        return f"rejected: {reason}"

    async def _error(self, text: str, code: str, streamed: bool = False) -> None:
        log.warning("wyoming: %s", text)
        await self.write_event(WyomingError(text=text, code=code).event())
        if streamed:
            await self.write_event(SynthesizeStopped().event())
