"""A transcription server for tests: a real ThreadingHTTPServer on 127.0.0.1 that speaks the
OpenAI transcription API (multipart form in, JSON out), records what it received and answers what
the test chose (a transcript, an HTTP error, silence, a trickle)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    content_type: str
    fields: dict[str, str]
    filename: str | None
    file_type: str | None
    wav: bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b'{"text": "Hello world again"}'
    delay_s: float = 0.0
    trickle: bool = False
    """Send a status line, then one header byte every 50 ms, never finishing."""


@dataclass
class Endpoint:
    url: str
    answer: Answer = field(default_factory=Answer)
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    """Set at teardown, so a sleeping or trickling handler ends at once."""


def parse_multipart(body: bytes, content_type: str) -> dict[bytes, tuple[dict[str, str], bytes]]:
    """name -> (part headers, content): a small strict parser of multipart/form-data."""
    kind, _, param = content_type.partition(";")
    assert kind.strip() == "multipart/form-data"
    key, _, boundary = param.strip().partition("=")
    assert key == "boundary" and boundary
    chunks = body.split(b"--" + boundary.encode())
    assert chunks[0] == b"" and chunks[-1] == b"--\r\n"
    parts: dict[bytes, tuple[dict[str, str], bytes]] = {}
    for chunk in chunks[1:-1]:
        assert chunk.startswith(b"\r\n") and chunk.endswith(b"\r\n")
        head, _, content = chunk[2:-2].partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        disposition = dict(
            item.strip().split("=", 1) for item in headers["Content-Disposition"].split(";")[1:])
        headers.update({f"cd-{k}": v.strip('"') for k, v in disposition.items()})
        parts[headers["cd-name"].encode()] = (headers, content)
    return parts


@contextmanager
def transcription_server(port: int = 0) -> Iterator[Endpoint]:
    """A real HTTP server on 127.0.0.1 (port 0: any free one) speaking the transcription API; answers
    `endpoint.answer`."""
    ep = Endpoint(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            ctype = self.headers["Content-Type"]
            parts = parse_multipart(body, ctype)
            file_headers, wav = parts[b"file"]
            ep.received.append(Received(
                self.path, ctype,
                {k.decode(): v.decode() for k, (_, v) in parts.items() if k != b"file"},
                file_headers.get("cd-filename"), file_headers.get("Content-Type"), wav))
            answer = ep.answer
            if answer.trickle:
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    while not ep.release.wait(0.05):
                        self.wfile.write(b"X")
                        self.wfile.flush()
                except OSError:
                    pass  # the client gave up and closed: what this answer is for
                return
            if answer.delay_s and ep.release.wait(answer.delay_s):
                return  # teardown: the client is long gone
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ep.url = f"http://127.0.0.1:{server.server_address[1]}/v1/audio/transcriptions"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield ep
    finally:
        ep.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
