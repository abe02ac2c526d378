"""The history thread for tests: a real Store on a temporary SQLite file, the real thread, its
replies read from its real ZeroMQ pipe; commands are put on its inbox as the server and the loop
would put them."""

from __future__ import annotations

import time
import uuid

import numpy as np
import zmq

from edged import protocol as wire
from edged.history.rates import VoiceRates
from edged.history.service import Ack, Ended, History, Query, Reserve
from edged.history.store import Store

TEXT = "Hello world. This part was not heard."
RATE = 24000
SECONDS = 10
CLIENT = b"client-1"


class Rig:
    """The history thread on a temporary database; `ask` returns the session's turns."""

    def __init__(self, tmp, policy, *, timeout_s: float = 1.0, wait_s: float = 2.0, max_bytes: int = 8 << 20):
        self.context = zmq.Context.instance()
        endpoint = f"inproc://history-test-{uuid.uuid4().hex}"
        self.pull = self.context.socket(zmq.PULL)
        self.pull.bind(endpoint)
        self.store = Store(tmp / "history.sqlite3")
        self.history = History(self.store, policy, VoiceRates(300.0), context=self.context, replies=endpoint,
                               max_bytes=max_bytes, timeout_s=timeout_s, wait_s=wait_s)
        self.history.start()
        self.policy = policy

    def send(self, command) -> None:
        self.history.inbox.put(command)

    def speak(self, id, session="s", text=TEXT, local=False) -> None:
        self.send(Reserve(CLIENT, id, session, text, None, local))

    def end(self, id, reason="eos", seconds=SECONDS, played_ms=None, pcm=True) -> None:
        audio = np.zeros(seconds * RATE, np.float32) if pcm else None
        self.send(Ended(CLIENT, id, reason, seconds * 1000, played_ms, audio, RATE))

    def ack(self, id, played_ms, final=False) -> None:
        self.send(Ack(CLIENT, wire.Ack(id, played_ms, final)))

    def ask(self, session="s", wait=False, timeout=10.0) -> list[dict]:
        self.send(Query(CLIENT, wire.History(session, wait)))
        if not self.pull.poll(int(timeout * 1000)):
            raise TimeoutError("no history reply")
        frames = self.pull.recv_multipart()
        assert frames[0] == CLIENT
        message, _ = wire.decode_reply(frames[1:])
        assert isinstance(message, wire.HistoryReply)
        return message.turns

    def assistant(self, session="s", wait=False) -> dict:
        return [t for t in self.ask(session, wait) if t["role"] == "assistant"][-1]

    def settle(self) -> None:
        """Let runs that were started finish and be applied (a query is answered after them)."""
        time.sleep(0.05)
        self.ask()

    def close(self) -> None:
        self.history.stop()
        self.pull.close(linger=0)
