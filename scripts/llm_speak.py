#!/usr/bin/env python3
"""Speak an LLM's answer while it is being written: an OpenAI-compatible chat completion, streamed
(server-sent events), fed piece by piece into the edged daemon as streamed text.

    python scripts/llm_speak.py "What is the weather like on Mars?" \\
        --url http://127.0.0.1:8000/v1/chat/completions --model qwen3 [--system TEXT] \\
        [--api-key-file FILE] [--endpoint E] [--voice V] [--language L] [--session S] [--no-play] [--out FILE.wav]

The answer's text is printed as it arrives; the daemon's `done` report is printed as one JSON line
at the end (on stderr). With `--session`, the prompt is added to that session's history as the
user's turn and the answer becomes the assistant's turn, cut to what was heard. Exit codes: 0 the
answer was spoken to its end, 1 it ended otherwise (cancelled, interrupted, error), 2 the LLM or the
daemon refused the request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edged.client import Client, RequestRejected
from edged.config import default_endpoint


class LlmError(RuntimeError):
    """The completion endpoint refused the request or sent something that is not a completion stream."""


def completion_pieces(url: str, model: str, messages: list[dict], api_key: str | None = None,
                      timeout_s: float = 120.0) -> Iterator[str]:
    """The `delta.content` pieces of a streamed chat completion, as the server sends them."""
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
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt")
    p.add_argument("--url", required=True, help="the chat completions URL (…/v1/chat/completions)")
    p.add_argument("--model", required=True)
    p.add_argument("--system", default=None, help="a system message")
    p.add_argument("--api-key-file", type=Path, default=None, help="a file holding the API key (sent as a bearer token)")
    p.add_argument("--endpoint", default=None, help=f"the daemon (default: {default_endpoint()})")
    p.add_argument("--voice", default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--session", default=None, help="keep the exchange in this session's history")
    p.add_argument("--no-play", action="store_true", help="do not play on the daemon's speaker")
    p.add_argument("--out", type=Path, default=None, help="also stream the audio back and write it to a WAV file")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the LLM or the daemon")
    args = p.parse_args(argv)

    api_key = args.api_key_file.read_text().strip() if args.api_key_file else None
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
               [{"role": "user", "content": args.prompt}]

    def echoed(pieces: Iterator[str]) -> Iterator[str]:
        for piece in pieces:
            print(piece, end="", flush=True)
            yield piece
        print(flush=True)

    with Client(args.endpoint or default_endpoint(), timeout_s=args.timeout) as client:
        if args.session:
            client.turn(args.session, "user", args.prompt)
        utterance = client.speak("", more_text=True, voice=args.voice, language=args.language, session=args.session,
                                 play=not args.no_play, stream=args.out is not None)
        failed = None
        try:
            for piece in echoed(completion_pieces(args.url, args.model, messages, api_key, args.timeout)):
                if not utterance.feed(piece):
                    break  # the daemon ended it (rejected, cancelled, out of room)
            else:
                utterance.end()
        except LlmError as exc:
            failed = str(exc)
            utterance.cancel()  # what was said so far stays said; the rest never comes
        try:
            done = utterance.wait()
        except RequestRejected as exc:
            print(f"llm_speak: the daemon rejected the request: {exc.reason}", file=sys.stderr)
            return 2
    if failed:
        print(f"llm_speak: {failed}", file=sys.stderr)
    if args.out is not None:
        from edged.audio.wav import write_wav

        write_wav(args.out, utterance.pcm, utterance.sample_rate or 24000)
    print(json.dumps({"id": done.id, "reason": done.reason, "error": done.error, **done.report}), file=sys.stderr)
    if failed:
        return 2
    return 0 if done.reason in ("eos", "length") else 1


if __name__ == "__main__":
    sys.exit(main())
