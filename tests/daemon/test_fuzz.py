"""Hostile messages through the real daemon: a seeded mutator over valid messages, several clients at
once, interleaved with valid speaks (4000 messages, about 15 % of them valid speaks). Every id the
daemon accepts is accepted once and gets exactly one `done` (and no id gets a `done` it was not
accepted for), every valid speak is answered once, nothing is answered that was not asked, and the
daemon is still serving at the end."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import msgpack
import zmq

from edged.client import Client

CLIENTS = 4
MESSAGES = 1000  # per client
VALID_SHARE = 0.15


def template(rng: random.Random, n: int) -> dict:
    """A valid message of a random op, to mutate."""
    return rng.choice([
        {"op": "speak", "id": f"t{n}", "text": "A valid speak.", "play": False, "max_audio_ms": 80},
        {"op": "speak", "id": n, "text": "Streamed.", "play": False, "stream": True, "format": "s16le",
         "max_audio_ms": 160, "sampling": {"seed": 3, "temperature": 0.5}},
        {"op": "status"},
        {"op": "cancel", "id": f"t{n}"},
        {"op": "text", "id": f"t{n}", "text": "more", "final": True},
        {"op": "ack", "id": f"t{n}", "played_ms": 10, "final": False},
        {"op": "turn", "session": "fuzz", "role": "user", "content": "Hi."},
        {"op": "history", "session": "fuzz"},
    ])


def junk(rng: random.Random, depth: int = 0):
    """A random msgpack-able value: scalars of every type, strings, bytes, lists and maps."""
    kind = rng.randrange(9 if depth < 4 else 6)
    return [lambda: None, lambda: rng.random() < 0.5, lambda: rng.randrange(-2**63, 2**64),
            lambda: rng.uniform(-1e9, 1e9), lambda: "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(9))),
            lambda: rng.randbytes(rng.randrange(16)),
            lambda: [junk(rng, depth + 1) for _ in range(rng.randrange(4))],
            lambda: {str(junk(rng, depth + 1))[:8]: junk(rng, depth + 1) for _ in range(rng.randrange(4))},
            lambda: {"op": rng.choice(["speak", "status", "text", "cancel", "ack", "turn", "history", "x"]),
                     "id": junk(rng, depth + 1)}][kind]()


def mutate(rng: random.Random, message: dict) -> list[bytes]:
    """One hostile message made from a valid one (a list of frames)."""
    raw = msgpack.packb(message)
    how = rng.randrange(10)
    if how == 0:  # flip bytes
        b = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return [bytes(b)]
    if how == 1:  # truncate
        return [raw[:rng.randrange(len(raw))]]
    if how == 2:  # trailing garbage
        return [raw + rng.randbytes(rng.randrange(1, 8))]
    if how == 3:  # a field of the wrong type
        key = rng.choice(list(message))
        return [msgpack.packb({**message, key: junk(rng)})]
    if how == 4:  # an unknown field
        return [msgpack.packb({**message, str(junk(rng))[:6] or "k": junk(rng)})]
    if how == 5:  # extra frames
        return [raw, *(rng.randbytes(rng.randrange(64)) for _ in range(rng.randrange(1, 3)))]
    if how == 6:  # deep nesting
        return [b"\x91" * rng.randrange(100, 3000) + b"\xc0"]
    if how == 7:  # invalid UTF-8 in a string
        return [raw.replace(b"\xa4text", b"\xa4text\xa2\xff\xfe", 1) if b"\xa4text" in raw else rng.randbytes(24)]
    if how == 8:  # not a map at all
        return [msgpack.packb(junk(rng))]
    return [rng.randbytes(rng.randrange(1, 48))]  # noise


def client_run(endpoint: str, seed: int, out: dict) -> None:
    rng = random.Random(seed)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    accepted, done, rejected, unexpected = Counter(), Counter(), Counter(), []
    sent_valid = 0
    try:
        for n in range(MESSAGES):
            if rng.random() < VALID_SHARE:
                sock.send(msgpack.packb({"op": "speak", "id": f"v{seed}-{n}", "text": "Valid among hostile.",
                                         "play": False, "max_audio_ms": 80}))
                sent_valid += 1
            else:
                sock.send_multipart(mutate(rng, template(rng, n)))
            drain(sock, accepted, done, rejected, unexpected, 0)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < (3 if accepted == done else 60):  # every done, then 3 s of quiet
            if drain(sock, accepted, done, rejected, unexpected, 200):
                quiet_since = time.monotonic()
    finally:
        sock.close()
    out[seed] = (accepted, done, rejected, unexpected, sent_valid)


def drain(sock, accepted: Counter, done: Counter, rejected: Counter, unexpected: list, timeout_ms: int) -> int:
    """Read every reply there is (waiting up to timeout_ms for the first); how many."""
    n = 0
    while sock.poll(timeout_ms if n == 0 else 0):
        frames = sock.recv_multipart()
        header = msgpack.unpackb(frames[0], strict_map_key=False)
        op = header.get("op")
        if op == "accepted":
            accepted[header["id"]] += 1
        elif op == "done":
            done[header["id"]] += 1
        elif op == "rejected":
            rejected[header["id"]] += 1
        elif op not in ("error", "audio", "status", "history"):
            unexpected.append(header)
        n += 1
    return n


def test_thousands_of_hostile_messages_from_several_clients(start_daemon):
    daemon = start_daemon(config="[daemon]\nqueue_limit = 64\n")
    out: dict = {}
    threads = [threading.Thread(target=client_run, args=(daemon.endpoint, seed, out)) for seed in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(out) == list(range(CLIENTS))
    for seed, (accepted, done, rejected, unexpected, sent_valid) in out.items():
        wrong = {id: (accepted[id], done[id]) for id in accepted | done if (accepted[id], done[id]) != (1, 1)}
        assert not wrong, f"client {seed}: ids not accepted once and done once: {wrong}"
        assert not unexpected, unexpected
        mine = [id for id in accepted | rejected if isinstance(id, str) and id.startswith(f"v{seed}-")]
        served = sum(accepted[id] for id in mine)
        assert sum(accepted[id] + rejected[id] for id in mine) == sent_valid and served > 0, (served, sent_valid)
    with Client(daemon.endpoint) as client:
        assert client.status()["state"] == "serving"
        assert client.speak("Still serving.", play=False, max_audio_ms=160).wait().reason == "length"
    assert daemon.proc.poll() is None
