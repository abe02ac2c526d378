"""Raw protocol frames for tests that speak to the daemon, or decode, below the client library."""

from __future__ import annotations

import msgpack


def pack(header: object) -> list[bytes]:
    """One message: the msgpack header frame alone."""
    return [msgpack.packb(header, use_bin_type=True)]


def speak_header(**extra) -> dict:
    """A valid speak header (id r1, text "hi"), with `extra` keys added or replaced."""
    return {"op": "speak", "id": "r1", "text": "hi", **extra}
