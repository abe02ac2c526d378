"""The field checks of protocol v1: what each field of a message may hold, and the error that names it.

Each check raises ProtocolError naming where (e.g. "speak.play") and what it expected. The message
dataclasses in `edged.protocol` name their checks in `field(metadata=CHECK)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edged.request import SAMPLING_KEYS, Id

PROTOCOL_VERSION = 1
DEFAULT_MAX_MESSAGE_BYTES = 2 << 20
"""Largest client -> server message (all frames together) the server reads, in bytes."""
MAX_ID_CHARS = 128
FORMATS = ("f32le", "s16le")
BYTES_PER_SAMPLE = {"f32le": 4, "s16le": 2}
ROLES = ("user", "system", "assistant")
DONE_REASONS = ("eos", "length", "cancelled", "interrupted", "error")
TEXT_FILTERS = ("llm", "none")
"""A speak's text_filter: "llm" drops reasoning and markdown (edged.llm_text); "none" speaks the text as sent."""

# Id (edged.request): a request id, a non-empty string of at most 128 characters or an integer; echoed back exactly.


class ProtocolError(Exception):
    """A message that is not valid protocol v1; `reason` says what is wrong, `id` echoes its id if readable."""

    def __init__(self, reason: str, id: Id | None = None):
        super().__init__(reason)
        self.reason = reason
        self.id = id


# --- field checks: each raises ProtocolError naming `where` (e.g. "speak.play") and what it expected


Check = Callable[[Any, str], None]
Spec = Mapping[str, Check]
"""A field's dataclass metadata: {"check": check}."""


def describe(v: Any) -> str:
    """The msgpack type of a decoded value, with a short repr for scalars."""
    names = {type(None): "nil", bool: "bool", int: "int", float: "float", str: "str", bytes: "bin",
             list: "array", dict: "map"}
    name = names.get(type(v), type(v).__name__)
    if isinstance(v, (bool, int, float, str)):
        text = repr(v)
        return f"{name} {text if len(text) <= 40 else text[:37] + '...'}"
    return name


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_id(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, str) and 0 < len(v) <= MAX_ID_CHARS)


def _kind(expected: str, ok: Callable[[Any], bool]) -> Spec:
    def check(v: Any, where: str) -> None:
        if not ok(v):
            raise ProtocolError(f"{where} must be {expected}, got {describe(v)}")

    return {"check": check}


def _check(spec: Spec, v: Any, where: str) -> None:
    spec["check"](v, where)


def _one_of(values: tuple[str, ...]) -> Spec:
    return _kind("one of " + ", ".join(repr(x) for x in values), lambda v: isinstance(v, str) and v in values)


ID = _kind(f"a non-empty string of at most {MAX_ID_CHARS} characters, or an integer", is_id)
OPT_ID = _kind("an id or nil", lambda v: v is None or is_id(v))
STR = _kind("a string", lambda v: isinstance(v, str))
SESSION = _kind("a non-empty string", lambda v: isinstance(v, str) and v != "")
OPT_STR = _kind("a string or nil", lambda v: v is None or isinstance(v, str))
BOOL = _kind("a bool", lambda v: isinstance(v, bool))
INT_GE0 = _kind("an integer >= 0", lambda v: _is_int(v) and v >= 0)
INT_GT0 = _kind("an integer > 0", lambda v: _is_int(v) and v > 0)
OPT_INT_GT0 = _kind("an integer > 0, or nil", lambda v: v is None or (_is_int(v) and v > 0))
NUMBER_GE0 = _kind("a finite number >= 0", lambda v: _is_number(v) and math.isfinite(v) and v >= 0)
MAP = _kind("a map", lambda v: isinstance(v, dict))
OPT_MAP = _kind("a map or nil", lambda v: v is None or isinstance(v, dict))
ARRAY = _kind("an array", lambda v: isinstance(v, list))
NUMBER = _kind("a number", _is_number)
OPT_INT = _kind("an integer or nil", lambda v: v is None or _is_int(v))
FORMAT = _one_of(FORMATS)
ROLE = _one_of(ROLES)
DONE_REASON = _one_of(DONE_REASONS)
OPT_TEXT_FILTER = _kind("one of " + ", ".join(repr(x) for x in TEXT_FILTERS) + ", or nil",
                        lambda v: v is None or (isinstance(v, str) and v in TEXT_FILTERS))


def _keys(d: dict, where: str, known: Sequence[str], required: Sequence[str] = ()) -> None:
    for k in d:
        if k not in known:
            raise ProtocolError(f"{where}: unknown key {k!r} (known: {', '.join(known)})")
    for k in required:
        if k not in d:
            raise ProtocolError(f"{where}: missing key {k!r}")


def _sampling(v: Any, where: str) -> None:
    """Key names and types only (a nil value is the key's default); the runtime checks ranges when
    it admits the request."""
    _check(OPT_MAP, v, where)
    if v is None:
        return
    _keys(v, where, SAMPLING_KEYS)
    for k, x in v.items():
        if x is not None:
            _check(OPT_INT if k == "seed" else NUMBER, x, f"{where}.{k}")


TURN_KEYS = ("role", "content", "interrupted", "response_id", "pending")


def _turns(v: Any, where: str) -> None:
    _check(ARRAY, v, where)
    for i, turn in enumerate(v):
        at = f"{where}[{i}]"
        _check(MAP, turn, at)
        _keys(turn, at, TURN_KEYS, required=("role", "content"))
        _check(ROLE, turn["role"], f"{at}.role")
        _check(STR, turn["content"], f"{at}.content")
        if "interrupted" in turn:
            _check(BOOL, turn["interrupted"], f"{at}.interrupted")
        if "response_id" in turn:
            _check(ID, turn["response_id"], f"{at}.response_id")
        if "pending" in turn:
            _check(BOOL, turn["pending"], f"{at}.pending")


def _context(v: Any, where: str) -> None:
    """Earlier turns for the talker: nil, or [{role, content}]."""
    if v is None:
        return
    _check(ARRAY, v, where)
    for i, turn in enumerate(v):
        at = f"{where}[{i}]"
        _check(MAP, turn, at)
        _keys(turn, at, ("role", "content"), required=("role", "content"))
        _check(ROLE, turn["role"], f"{at}.role")
        _check(STR, turn["content"], f"{at}.content")


MEDIA_DTYPES = {"float16": 2, "float32": 4}
"""Element types of a speak's media frame (little-endian), and their sizes in bytes."""


def _media(v: Any, where: str) -> None:
    """The layout of a speak's binary frame of thinker hidden states: nil, or {dtype, shape: [rows, width]}."""
    if v is None:
        return
    _check(MAP, v, where)
    _keys(v, where, ("dtype", "shape"), required=("dtype", "shape"))
    _check(_one_of(tuple(MEDIA_DTYPES)), v["dtype"], f"{where}.dtype")
    shape = v["shape"]
    if not (isinstance(shape, list) and len(shape) == 2 and all(_is_int(x) and x > 0 for x in shape)):
        got = f"{shape!r:.60}" if isinstance(shape, list) else describe(shape)
        raise ProtocolError(f"{where}.shape must be [rows, width], two integers > 0, got {got}")


SAMPLING: Spec = {"check": _sampling}
MEDIA: Spec = {"check": _media}
TURNS: Spec = {"check": _turns}
CONTEXT: Spec = {"check": _context}
