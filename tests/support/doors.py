"""The front doors as subprocesses (`python -m edged wyoming|http`) in front of a test's daemon."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Door:
    """`edged NAME ARGS...` listening on 127.0.0.1:port; ready once the port takes a connection."""

    def __init__(self, tmp: Path, name: str, port: int, *args: str, timeout: float = 60):
        self.port = port
        self.log_path = tmp / f"{name}-{port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "edged", name, *args], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edged {name} exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"edged {name} not listening on {port} within {timeout} s:\n{self.read_log()}") from None
                time.sleep(0.1)

    def read_log(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        return self.proc.wait()


def wyoming(tmp: Path, endpoint: str, *args: str) -> Door:
    port = free_port()
    return Door(tmp, "wyoming", port, "--uri", f"tcp://127.0.0.1:{port}", "--endpoint", endpoint, *args)


def http(tmp: Path, endpoint: str, *args: str) -> Door:
    port = free_port()
    return Door(tmp, "http", port, "--listen", f"127.0.0.1:{port}", "--endpoint", endpoint, *args)


async def read_reply(client: AsyncTcpClient, until: str = "audio-stop") -> tuple[list[str], bytes, list]:
    """Events up to `until` (or an error): their types, the audio, and the events themselves."""
    types, audio, events = [], b"", []
    while True:
        event = await client.read_event()
        assert event is not None, f"connection closed after {types}"
        types.append(event.type)
        events.append(event)
        if AudioChunk.is_type(event.type):
            audio += AudioChunk.from_event(event).audio
        if event.type in (until, "error"):
            return types, audio, events
