"""An OpenAI-compatible chat completion, streamed: the answer's pieces as the server sends them
(server-sent events). What `edged converse` and scripts/llm_speak.py ask the LLM with."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit


class LlmError(RuntimeError):
    """The completion endpoint refused the request or sent something that is not a completion stream."""


def completion_pieces(url: str, model: str, messages: list[dict], api_key: str | None = None,
                      timeout_s: float = 120.0) -> Iterator[str]:
    """The `delta.content` pieces of a streamed chat completion, as the server sends them (its
    reasoning, `delta.reasoning_content`, is left out)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LlmError(f"{url}: not an http(s) URL")
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout_s)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = json.dumps({"model": model, "messages": messages, "stream": True})
    try:
        connection.request("POST", parts.path or "/", body=body, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            raise LlmError(f"{url}: HTTP {response.status}: {response.read(500).decode(errors='replace')}")
        for raw in response:  # one server-sent-event line at a time, as it arrives
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue  # blank separators, comments, other SSE fields
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return
            try:
                choice = json.loads(data)["choices"][0]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise LlmError(f"{url}: not a chat completion chunk: {data[:200]!r}") from exc
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                yield piece
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, not HTTP
        raise LlmError(f"{url}: {exc}") from exc
    finally:
        connection.close()
