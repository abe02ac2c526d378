"""A client for an OpenAI-compatible transcription endpoint (`POST .../v1/audio/transcriptions`):
the `asr` calibration policy sends it the part of a reply the listener heard (heard-text notes §3.1).

- `heard_pcm`: the reply's first `max(0, played_ms - guard_ms)` of audio; refused (None) under half a
  second or with non-finite samples. The guard also keeps a word being spoken at the cut out.
- `Transcriber.transcribe`: one multipart POST `{file, model, response_format=json}` on its own
  connection (so calls may run on any thread at once), the whole request bounded by `timeout_s`;
  every failure is a `TranscriptionError` naming why. A transcript is evidence only: the caller
  aligns it against the original text and never stores it.

Nothing here logs a transcript or audio: only sizes, timings and status codes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import secrets
import socket
import threading
import time
from urllib.parse import urlsplit

import numpy as np

log = logging.getLogger("edged.history")

MIN_HEARD_S = 0.5
"""Less heard audio than this is not worth transcribing (too few words to align)."""


class TranscriptionError(RuntimeError):
    """A transcription call failed; `reason` says why (never contains the transcript or audio)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def heard_pcm(pcm: np.ndarray, sample_rate: int, played_ms: float, guard_ms: float = 160) -> np.ndarray | None:
    """The first `max(0, (played_ms - guard_ms) * sample_rate // 1000)` samples of `pcm` (a view);
    None when that is under 0.5 s of audio or holds a non-finite sample."""
    if pcm.ndim != 1 or sample_rate <= 0:
        raise ValueError(f"heard_pcm needs mono PCM and a positive rate (shape {pcm.shape}, rate {sample_rate})")
    samples = int(max(0, (played_ms - guard_ms) * sample_rate // 1000))
    heard = pcm[:samples]
    if len(heard) < MIN_HEARD_S * sample_rate or not np.isfinite(heard).all():
        return None
    return heard


class Transcriber:
    """Transcribes WAV audio at `url`, the full endpoint URL (http or https, no credentials in it).

    Thread-safe: it holds only its settings; each call opens and closes its own connection.
    """

    def __init__(self, url: str, model: str, timeout_s: float = 5.0, max_chars: int = 8192) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"transcription URL must be http or https, not {parts.scheme or 'no scheme'!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("transcription URL must not contain credentials (user:password@)")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"transcription URL has an invalid port: {exc}") from None
        if not parts.hostname:
            raise ValueError("transcription URL has no host")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"transcription timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if max_chars <= 0:
            raise ValueError(f"transcription max_chars must be positive, not {max_chars!r}")
        self.url = url
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_chars = max_chars
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # JSON may escape every char as \uXXXX (12 bytes for a surrogate pair), plus the envelope.
        self._max_body = 12 * max_chars + 65536

    def transcribe(self, wav: bytes) -> str:
        """POST `wav` and return the transcript; raises TranscriptionError on any failure, at most
        about `timeout_s` after the call (connect, send, wait and read together)."""
        t0 = time.monotonic()
        deadline = t0 + self.timeout_s
        body, content_type = self._form(wav)
        status, payload = self._post(body, content_type, deadline)
        text = self._parse(status, payload)
        log.debug("asr: sent %d bytes, HTTP %d, %d bytes back, %d chars, %.0f ms",
                  len(wav), status, len(payload), len(text), (time.monotonic() - t0) * 1000)
        return text

    def _form(self, wav: bytes) -> tuple[bytes, str]:
        boundary = secrets.token_hex(16)
        while boundary.encode() in wav:  # practically never; a boundary must not occur in a part
            boundary = secrets.token_hex(16)
        head = f"--{boundary}\r\n"
        fields = [
            (f'{head}Content-Disposition: form-data; name="file"; filename="heard.wav"\r\n'
             "Content-Type: audio/wav\r\n\r\n").encode() + wav + b"\r\n",
            f'{head}Content-Disposition: form-data; name="model"\r\n\r\n{self.model}\r\n'.encode(),
            f'{head}Content-Disposition: form-data; name="response_format"\r\n\r\njson\r\n'.encode(),
            f"--{boundary}--\r\n".encode(),
        ]
        return b"".join(fields), f"multipart/form-data; boundary={boundary}"

    def _post(self, body: bytes, content_type: str, deadline: float) -> tuple[int, bytes]:
        """One request on its own connection; a watchdog shuts the socket at the deadline, since a
        socket timeout bounds each read, not a server that trickles its answer."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=max(0.001, deadline - time.monotonic()))
        lock = threading.Lock()
        state = {"closed": False, "expired": False}

        def expire() -> None:
            with lock:
                if state["closed"]:
                    return
                state["expired"] = True
                if conn.sock is not None:
                    with contextlib.suppress(OSError):  # already torn down: the blocked call fails on its own
                        socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()  # bounded by the socket timeout; the watchdog cannot reach a socket not yet made
            if state["expired"]:
                raise TimeoutError
            conn.request("POST", self._target, body, {
                "Content-Type": content_type, "Accept": "application/json", "Connection": "close"})
            response = conn.getresponse()
            payload = response.read(self._max_body + 1)
            with lock:
                if state["expired"]:  # the read may have ended early because the watchdog shut the socket
                    raise TimeoutError
                state["closed"] = True
            return response.status, payload
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if state["expired"] or isinstance(exc, TimeoutError):
                raise TranscriptionError(f"timed out after {self.timeout_s:g} s") from None
            raise TranscriptionError(f"request failed: {type(exc).__name__}: {exc}") from None
        finally:
            watchdog.cancel()
            with lock:
                state["closed"] = True
                conn.close()

    def _parse(self, status: int, payload: bytes) -> str:
        if not 200 <= status < 300:
            log.debug("asr: HTTP %d, %d bytes back", status, len(payload))
            raise TranscriptionError(f"HTTP {status}")
        if len(payload) > self._max_body:
            raise TranscriptionError(f"response over {self._max_body} bytes")
        try:
            data = json.loads(payload)
        except ValueError:
            raise TranscriptionError(f"response is not JSON ({len(payload)} bytes)") from None
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise TranscriptionError('response has no string "text"')
        text: str = data["text"]
        if len(text) > self.max_chars:
            raise TranscriptionError(f"transcript of {len(text)} chars is over {self.max_chars}")
        return text
