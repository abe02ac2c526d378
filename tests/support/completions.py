"""A small OpenAI-compatible chat completions server on 127.0.0.1, as LLM servers stream them
(server-sent events, one `delta` per chunk): it keeps each request it gets and answers the n-th with
the n-th of its canned answers (the last one again after that)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def content(pieces: list[str]) -> list[dict]:
    """An answer's deltas: each piece as `delta.content`."""
    return [{"content": piece} for piece in pieces]


@dataclass
class Completions:
    url: str = ""
    answers: list[list[dict]] = field(default_factory=lambda: [content(["Hello."])])
    """Each answer is its deltas, in order (e.g. {"content": "Mars"}, {"reasoning_content": "..."})."""
    failure: bytes | None = None
    """Answer every request with HTTP 500 and this body instead."""
    requests: list[dict] = field(default_factory=list)
    """{"body": the request's JSON, "auth": its Authorization header}, in order."""

    def messages(self, n: int) -> list[dict]:
        return self.requests[n]["body"]["messages"]


@contextmanager
def completions_server(port: int = 0) -> Iterator[Completions]:
    """port 0: any free one."""
    server_state = Completions()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = len(server_state.requests)
            server_state.requests.append({"body": body, "auth": self.headers.get("Authorization")})
            if server_state.failure is not None:
                self.send_response(500)
                self.end_headers()
                self.wfile.write(server_state.failure)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            deltas = [{"role": "assistant"}, *server_state.answers[min(n, len(server_state.answers) - 1)]]
            try:
                for delta in deltas:
                    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.03)  # as a model writes: the answer arrives in pieces
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading (its reply had ended): so does a server

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server_state.url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()
