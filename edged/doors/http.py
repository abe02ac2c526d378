"""`edged http`: OpenAI's speech API in front of the daemon, on Starlette (served by uvicorn).

- `POST /v1/audio/speech` {model, input, voice, response_format?, speed?, instructions?,
  stream_format?}: the body streams as the daemon streams the audio. Formats: "wav" (the default
  here; 16-bit mono at the model's rate, its RIFF and data sizes 0xFFFFFFFF since the length is not
  known when the header leaves) and "pcm" (raw s16le mono). `stream_format: "sse"`: server-sent
  events `speech.audio.delta` (base64 of the same bytes) and `speech.audio.done` (with `usage`).
- `GET /v1/models`, `GET /healthz` (the daemon's state; 503 when it is down or draining).
- Errors have OpenAI's shape {"error": {message, type, param, code}}: 400 a bad request (an unknown
  voice lists the voices), 401 a missing or wrong key (when one is configured: every path but
  /healthz, unknown ones included), 404 no such path, 405 a method the path does not take, 429 the
  daemon is busy, 503 it is down or shutting down, 500 it failed before any audio.
- A client that disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from edged.client import Audio
from edged.doors.link import DaemonDown, DaemonLink, Speech
from edged.doors.offer import OfferCache, speak_voice, unknown_voice
from edged.protocol import Done, ProtocolError, Rejected
from edged.protocol.checks import TEXT_FILTERS

log = logging.getLogger(__name__)

MODEL = "edged"
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""Model names OpenAI clients send; each means this daemon's model."""
MAX_INPUT = 4096  # characters, as OpenAI's API
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
UNSUPPORTED_FORMATS = ("mp3", "opus", "aac", "flac")


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


def down(exc: Exception) -> ApiError:
    return ApiError(503, f"the speech daemon is unavailable: {exc}", code="daemon_unavailable", type="server_error")


def refused(reason: str) -> ApiError:
    """The daemon's `rejected` reason as an HTTP error."""
    if reason.startswith("busy"):
        return ApiError(429, f"the speech daemon is busy: {reason}", code="rate_limit_exceeded", type="rate_limit_error")
    if reason.startswith("shutting down"):
        return ApiError(503, "the speech daemon is shutting down", code="daemon_unavailable", type="server_error")
    return ApiError(400, reason, param="input" if reason.startswith("text") else None)


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header of unknown length (sizes 0xFFFFFFFF), as streamed WAV is written."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", 0xFFFFFFFF))


def speech_fields(body: Any, text_filter: str = "none") -> dict[str, Any]:
    """The request body, checked: {input, voice, format, instructions, sse, text_filter} (`text_filter`:
    the door's default where the body has none); ApiError 400 names the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise ApiError(400, f"model is missing (models: {', '.join((MODEL, *MODEL_ALIASES))})", param="model")
    if model not in (MODEL, *MODEL_ALIASES):
        raise ApiError(400, f"model {model!r} is not served here (models: {', '.join((MODEL, *MODEL_ALIASES))})",
                       param="model", code="model_not_found")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "input must be a non-empty string", param="input")
    if len(text) > MAX_INPUT:
        raise ApiError(400, f"input is {len(text)} characters; at most {MAX_INPUT}", param="input")
    voice = body.get("voice", "default")
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str):
        raise ApiError(400, "voice must be a string (a voice name, or \"default\")", param="voice")
    fmt = body.get("response_format", "wav")
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format {fmt!r} is not supported (supported: {', '.join(FORMATS)})",
                       param="response_format")
    speed = body.get("speed", 1.0)
    if speed != 1.0:
        raise ApiError(400, f"speed {speed!r} is not supported: only 1.0", param="speed")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise ApiError(400, f"stream_format {stream_format!r} is not supported (supported: audio, sse)",
                       param="stream_format")
    text_filter = body.get("text_filter", text_filter)
    if text_filter not in TEXT_FILTERS:
        raise ApiError(400, f"text_filter {text_filter!r} is not supported (supported: {', '.join(TEXT_FILTERS)})",
                       param="text_filter")
    return {"input": text, "voice": voice, "format": fmt, "instructions": instructions or None,
            "sse": stream_format == "sse", "text_filter": text_filter}


class SpeechBody:
    """The streamed body of one speech response (an ASGI response): the audio as the daemon sends it,
    the daemon's request cancelled the moment the client disconnects."""

    def __init__(self, speech: Speech, first: Audio | Done, *, rate: int, fmt: str, sse: bool):
        self.speech, self.first, self.rate, self.fmt, self.sse = speech, first, rate, fmt, sse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        media = "text/event-stream" if self.sse else FORMATS[self.fmt]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", media.encode()), (b"cache-control", b"no-store")]})
        watcher = asyncio.create_task(self._watch(receive))
        try:
            async for piece in self._pieces():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError as exc:
            log.info("http client gone (%s): cancelling %s", exc, self.speech.id)
        finally:
            watcher.cancel()
            await self.speech.cancel()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        log.info("http client disconnected: cancelling %s", self.speech.id)
        await self.speech.cancel()

    async def _pieces(self) -> AsyncIterator[bytes]:
        event: Audio | Done | Any = self.first
        header = wav_header(self.rate) if self.fmt == "wav" else b""
        while True:
            if isinstance(event, Audio):
                yield self._piece(header + event.pcm.tobytes())
                header = b""
            elif isinstance(event, Done):
                if header:
                    yield self._piece(header)
                if event.reason == "error":
                    log.error("speech %s failed after its first audio: %s", self.speech.id, event.error)
                elif self.sse:
                    yield self._event({"type": "speech.audio.done", "usage": usage(event)})
                return
            if self.speech.finished:
                return
            try:
                event = await self.speech.next()
            except (DaemonDown, ProtocolError) as exc:
                log.error("speech %s: %s (the body ends here)", self.speech.id, exc)
                return

    def _piece(self, audio: bytes) -> bytes:
        if not self.sse:
            return audio
        return self._event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode()})

    @staticmethod
    def _event(data: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(data)}\n\n".encode()


def usage(done: Done) -> dict[str, int]:
    """OpenAI's `usage`: input tokens are the text's tokens, output tokens the codec frames."""
    talker: dict[str, Any] = next((s for s in done.report.get("stages", []) if s.get("stage") == "talker"), {})
    tokens_in, tokens_out = int(talker.get("text_tokens", 0)), int(done.report.get("frames", 0))
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}


class HttpDoor:
    def __init__(self, link: DaemonLink, *, api_key: str | None = None, text_filter: str = "none"):
        """text_filter: what a request without `text_filter` gets ("llm": no reasoning, no markdown)."""
        self.link = link
        self.offers = OfferCache(link)
        self.api_key = api_key
        self.text_filter = text_filter

    async def speech(self, request: Request) -> Response | SpeechBody:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not JSON: {exc}") from None
        fields = speech_fields(body, self.text_filter)
        model, voice = await self.offers.model(), speak_voice(fields["voice"])
        instruct = fields["instructions"] if model.instruct else None
        if fields["instructions"] and not model.instruct:
            log.info("instructions ignored: this model (%s) takes none", model.type)
        speech = await self.link.speak(fields["input"], voice=voice, instruct=instruct, format="s16le",
                                       text_filter=fields["text_filter"])
        try:
            first = await speech.next()
            if isinstance(first, Rejected):
                if voice is not None and first.reason.startswith("unknown voice"):
                    error = unknown_voice(fields["voice"], await self.offers.voices(fresh=True))
                    raise ApiError(400, str(error), param="voice")
                raise refused(first.reason)
            first = await speech.next()  # the first audio, or a done without any: errors keep their status
        except BaseException:
            await speech.cancel()
            raise
        assert isinstance(first, (Audio, Done)), first
        if isinstance(first, Done) and first.reason == "error":
            raise ApiError(500, f"speech failed: {first.error}", code="speech_failed", type="server_error")
        if isinstance(first, Done) and first.reason == "cancelled":
            raise down(RuntimeError("the request was cancelled in the daemon"))
        return SpeechBody(speech, first, rate=model.sample_rate, fmt=fields["format"], sse=fields["sse"])

    async def models(self, request: Request) -> Response:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "edged"} for name in (MODEL, *MODEL_ALIASES)]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        try:
            status = await self.link.status()
        except DaemonDown as exc:
            return JSONResponse({"status": "down", "error": str(exc)}, status_code=503)
        state = status["state"]
        return JSONResponse({"status": "ok" if state == "serving" else state, "daemon": state,
                             "model": status.get("model", {}).get("type"), "cohort": status["cohort"]["running"],
                             "queue": status["queue"]["waiting"]}, status_code=200 if state == "serving" else 503)

    def authorized(self, request: Request) -> bool:
        if self.api_key is None or request.url.path == "/healthz":
            return True
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key.encode())


UNAUTHORIZED = ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)", code="invalid_api_key")


def app(door: HttpDoor) -> Starlette:
    def guarded(endpoint: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        async def run(request: Request) -> Any:
            try:
                if not door.authorized(request):
                    raise UNAUTHORIZED
                return await endpoint(request)
            except ApiError as exc:
                return exc.response()
            except (DaemonDown, ProtocolError) as exc:
                return down(exc).response()
        return run

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await door.link.start()
        yield
        await door.link.close()

    async def refused(request: Request, exc: Exception) -> Response:
        """Starlette's own refusals (404 no such path, 405 a method the path does not take) in
        OpenAI's shape, behind the key as every path but /healthz is."""
        assert isinstance(exc, HTTPException)
        if not door.authorized(request):
            return UNAUTHORIZED.response()
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        response = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code).response()
        response.headers.update(exc.headers or {})
        return response

    return Starlette(routes=[Route("/v1/audio/speech", guarded(door.speech), methods=["POST"]),
                             Route("/v1/models", guarded(door.models)),
                             Route("/healthz", guarded(door.health))],
                     exception_handlers={HTTPException: refused}, lifespan=lifespan)
