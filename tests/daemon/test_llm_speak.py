"""scripts/llm_speak.py against a small local HTTP server that streams a canned chat completion
(server-sent events, as OpenAI-compatible servers send them), into the real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edged.client import Client

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llm_speak.py"
ANSWER = ["Mars", " is", " cold", " and", " dry", ",", " with", " thin", " air", " and", " red", " dust", "."]


class Completions(BaseHTTPRequestHandler):
    requests: list[dict] = []
    fail = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Completions.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        if Completions.fail:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"model is loading")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        role = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        self.wfile.write(f"data: {json.dumps(role)}\n\n".encode())
        for piece in ANSWER:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.03)
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"


def run(url: str, endpoint: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "What is Mars like?", "--url", url, "--model", "tiny",
                           "--endpoint", endpoint, "--no-play", *extra], capture_output=True, text=True, timeout=120)


def test_the_bridge_speaks_the_completion_as_it_streams(start_daemon, tmp_path):
    daemon = start_daemon()
    server, url = serve()
    key = tmp_path / "key"
    key.write_text("secret-key\n")
    try:
        Completions.fail = False
        done = run(url, daemon.endpoint, "--session", "mars", "--system", "Be brief.", "--api-key-file", str(key),
                   "--out", str(tmp_path / "answer.wav"))
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "".join(ANSWER)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["reason"] in ("eos", "length") and report["stages"][0]["text_tokens"] > 10
    sent = Completions.requests[-1]
    assert sent["auth"] == "Bearer secret-key" and sent["body"]["stream"] is True
    assert sent["body"]["messages"] == [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "What is Mars like?"}]
    with Client(daemon.endpoint) as client:
        turns = client.history("mars", wait=True)
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[1]["response_id"] == report["id"]


def test_a_failing_llm_is_reported_and_nothing_is_left_open(start_daemon):
    daemon = start_daemon()
    server, url = serve()
    try:
        Completions.fail = True
        done = run(url, daemon.endpoint)
    finally:
        server.shutdown()
    assert done.returncode == 2 and "HTTP 500: model is loading" in done.stderr
    with Client(daemon.endpoint) as client:
        status = client.status()
    assert status["cohort"]["running"] == 0 and status["queue"]["waiting"] == 0
    assert status["counters"]["done"]["cancelled"] == 1
