"""Wire protocol v1: typed messages, one framing pair, and the one place that decodes.

A message is one msgpack map (the header, with an `op`) optionally followed by ONE binary frame:
`audio` (server -> client) carries its PCM, and `speak` with `media` the thinker's hidden states;
each says in its header how many bytes the frame has (`frame_bytes`), and no other message has one.
Over the ROUTER socket the server sees the peer's identity frame first: strip it, pass the rest to
`decode`. docs/protocol.md is the reference.

Each message is a frozen dataclass whose fields are the wire table: `field(metadata=CHECK)` names
the check `decode` runs on the field. A field without a default is required; an optional field
may be absent or nil; a field the op does not have is an error (typos are caught).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from edged.protocol.checks import (
    ARRAY,
    BOOL,
    BYTES_PER_SAMPLE,
    CONTEXT,
    DEFAULT_MAX_MESSAGE_BYTES,
    DONE_REASON,
    DONE_REASONS,
    FORMAT,
    FORMATS,
    ID,
    INT_GE0,
    INT_GT0,
    MAP,
    MAX_ID_CHARS,
    MEDIA,
    MEDIA_DTYPES,
    NUMBER_GE0,
    OPT_ID,
    OPT_INT_GT0,
    OPT_STR,
    OPT_TEXT_FILTER,
    PROTOCOL_VERSION,
    ROLE,
    ROLES,
    SAMPLING,
    SESSION,
    STR,
    TEXT_FILTERS,
    TURNS,
    ProtocolError,
    describe,
    is_id,
)
from edged.request import SAMPLING_KEYS, Id

Buffer = bytes | bytearray | memoryview

# --- client -> server


@dataclass(frozen=True)
class Speak:
    """Speak `text`: answered by `accepted` (then audio chunks and one `done`) or `rejected`."""

    op: ClassVar[str] = "speak"
    id: Id = field(metadata=ID)
    text: str = field(metadata=STR)
    more_text: bool = field(default=False, metadata=BOOL)
    """More text follows in `text` messages for this id, the last with final: true."""
    text_filter: str | None = field(default=None, metadata=OPT_TEXT_FILTER)
    """"llm": reasoning (<think>) and markdown are not spoken (edged.llm_text); "none": the text as
    sent. None: "llm" with more_text, "none" without."""
    session: str | None = field(default=None, metadata=OPT_STR)
    """Conversation whose history gets this utterance as an assistant turn; None: no history."""
    voice: str | None = field(default=None, metadata=OPT_STR)
    language: str | None = field(default=None, metadata=OPT_STR)
    instruct: str | None = field(default=None, metadata=OPT_STR)
    play: bool = field(default=True, metadata=BOOL)
    """Play on the daemon's local speaker."""
    stream: bool = field(default=False, metadata=BOOL)
    """Send the PCM back to this client as `audio` messages."""
    format: str = field(default="f32le", metadata=FORMAT)
    """PCM sample format of streamed audio: "f32le" or "s16le" (mono, little-endian)."""
    max_audio_ms: int | None = field(default=None, metadata=OPT_INT_GT0)
    """Stop with reason "length" after this much audio, in milliseconds."""
    sampling: dict[str, Any] | None = field(default=None, metadata=SAMPLING)
    """Overrides of the artifact's sampling defaults (keys: edged.request.SAMPLING_KEYS)."""
    report_codes: bool = field(default=False, metadata=BOOL)
    """Include the generated codec frames (`rvq_codes`) in the done report."""
    context: list[dict[str, str]] | None = field(default=None, metadata=CONTEXT)
    """Earlier turns as the thinker saw them, [{role, content}] (Qwen3-Omni artifacts: user turns
    become talker rows, system and assistant turns are dropped; other artifacts reject it)."""
    media: dict[str, Any] | None = field(default=None, metadata=MEDIA)
    """{dtype: "float16" | "float32", shape: [rows, width]}: the binary frame holds the thinker's hidden
    states of the media placeholders in the context's user turns, row-major, little-endian, one row
    per placeholder in order."""

    def frame_bytes(self) -> int | None:
        if self.media is None:
            return None
        rows, width = self.media["shape"]
        return rows * width * MEDIA_DTYPES[self.media["dtype"]]


@dataclass(frozen=True)
class Text:
    """More text for a speak sent with more_text: true; final: true ends its text."""

    op: ClassVar[str] = "text"
    id: Id = field(metadata=ID)
    text: str = field(metadata=STR)
    final: bool = field(default=False, metadata=BOOL)


@dataclass(frozen=True)
class Cancel:
    op: ClassVar[str] = "cancel"
    id: Id = field(metadata=ID)
    any_client: bool = field(default=False, metadata=BOOL)
    """Cancel every request in flight whose id, as `status` lists it (its string form), is this one's,
    of whichever client (`edged cancel`); by default only this client's own."""


@dataclass(frozen=True)
class Ack:
    """Playback progress of streamed audio that the client plays itself."""

    op: ClassVar[str] = "ack"
    id: Id = field(metadata=ID)
    played_ms: float = field(metadata=NUMBER_GE0)
    """Milliseconds of this utterance's audio actually heard so far."""
    final: bool = field(default=False, metadata=BOOL)
    """Playback of this utterance ended (completely or cut off at played_ms)."""


@dataclass(frozen=True)
class Turn:
    """Append a turn to a session's history."""

    op: ClassVar[str] = "turn"
    session: str = field(metadata=SESSION)
    role: str = field(metadata=ROLE)
    content: str = field(metadata=STR)


@dataclass(frozen=True)
class History:
    op: ClassVar[str] = "history"
    session: str = field(metadata=SESSION)
    wait: bool = field(default=False, metadata=BOOL)
    """First wait (one bounded deadline) for the session's pending calibrations."""
    close: bool = field(default=False, metadata=BOOL)
    """After answering, release what the daemon holds for the session (cursors, recordings, runs);
    its turns stay on disk."""


@dataclass(frozen=True)
class Status:
    op: ClassVar[str] = "status"


@dataclass(frozen=True)
class VoiceAdd:
    """Enroll a voice cloned from a reference recording, carried in the binary frame (mono PCM):
    answered by `voice_added` once it is encoded and stored, or `error`."""

    op: ClassVar[str] = "voice_add"
    name: str = field(metadata=STR)
    sample_rate: int = field(metadata=INT_GT0)
    samples: int = field(metadata=INT_GT0)
    """Number of samples in the binary frame (samples x bytes per sample)."""
    format: str = field(default="f32le", metadata=FORMAT)
    ref_text: str | None = field(default=None, metadata=OPT_STR)
    """What the recording says: the voice is cloned in context (ICL); without it, x-vector only."""
    id: Id | None = field(default=None, metadata=OPT_ID)
    """Echoed in the reply (and an `error`), to match them up."""

    def frame_bytes(self) -> int:
        return self.samples * BYTES_PER_SAMPLE[self.format]


@dataclass(frozen=True)
class VoiceRemove:
    op: ClassVar[str] = "voice_remove"
    name: str = field(metadata=STR)
    id: Id | None = field(default=None, metadata=OPT_ID)


@dataclass(frozen=True)
class Voices:
    """List the voices a speak may name: the artifact's speakers and the enrolled voices."""

    op: ClassVar[str] = "voices"
    id: Id | None = field(default=None, metadata=OPT_ID)


# --- server -> client


@dataclass(frozen=True)
class Accepted:
    op: ClassVar[str] = "accepted"
    id: Id = field(metadata=ID)


@dataclass(frozen=True)
class Rejected:
    op: ClassVar[str] = "rejected"
    id: Id = field(metadata=ID)
    reason: str = field(metadata=STR)


@dataclass(frozen=True)
class Audio:
    """One chunk of streamed PCM; the samples travel in the message's binary frame."""

    op: ClassVar[str] = "audio"
    id: Id = field(metadata=ID)
    seq: int = field(metadata=INT_GE0)
    """0, 1, 2, ... per request."""
    sample_rate: int = field(metadata=INT_GT0)
    format: str = field(metadata=FORMAT)
    first_sample: int = field(metadata=INT_GE0)
    """Index of this chunk's first sample in the utterance (chunks are contiguous)."""
    samples: int = field(metadata=INT_GE0)
    """Number of samples in this chunk (the binary frame is samples x bytes per sample)."""

    def frame_bytes(self) -> int:
        return self.samples * BYTES_PER_SAMPLE[self.format]


@dataclass(frozen=True)
class Done:
    """The one terminal message of an accepted request."""

    op: ClassVar[str] = "done"
    id: Id = field(metadata=ID)
    reason: str = field(metadata=DONE_REASON)
    error: str | None = field(default=None, metadata=OPT_STR)
    """What went wrong, when reason is "error"."""
    report: dict[str, Any] = field(default_factory=dict, metadata=MAP)


@dataclass(frozen=True)
class HistoryReply:
    op: ClassVar[str] = "history"
    session: str = field(metadata=STR)
    turns: list[dict[str, Any]] = field(metadata=TURNS)
    """[{role, content, interrupted?, response_id?}], oldest first."""


@dataclass(frozen=True)
class StatusReply:
    """The daemon's status: a free map, sent flat beside `op`."""

    op: ClassVar[str] = "status"
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VoiceAdded:
    op: ClassVar[str] = "voice_added"
    name: str = field(metadata=STR)
    voice: dict[str, Any] = field(default_factory=dict, metadata=MAP)
    """The voice as `voices` lists it."""
    id: Id | None = field(default=None, metadata=OPT_ID)


@dataclass(frozen=True)
class VoiceRemoved:
    op: ClassVar[str] = "voice_removed"
    name: str = field(metadata=STR)
    id: Id | None = field(default=None, metadata=OPT_ID)


@dataclass(frozen=True)
class VoicesReply:
    op: ClassVar[str] = "voices"
    voices: list[dict[str, Any]] = field(metadata=ARRAY)
    """[{name, kind: "builtin" | "enrolled", ...}], built-in speakers first, then by name."""
    id: Id | None = field(default=None, metadata=OPT_ID)


@dataclass(frozen=True)
class Error:
    """A message the server could not understand; the server carries on."""

    op: ClassVar[str] = "error"
    reason: str = field(metadata=STR)
    id: Id | None = field(default=None, metadata=OPT_ID)


Request = Speak | Text | Cancel | Ack | Turn | History | Status | VoiceAdd | VoiceRemove | Voices
Reply = Accepted | Rejected | Audio | Done | HistoryReply | StatusReply | VoiceAdded | VoiceRemoved | VoicesReply | Error
Message = Request | Reply

REQUESTS: dict[str, type] = {c.op: c for c in (Speak, Text, Cancel, Ack, Turn, History, Status, VoiceAdd, VoiceRemove,
                                               Voices)}
REPLIES: dict[str, type] = {c.op: c for c in (Accepted, Rejected, Audio, Done, HistoryReply, StatusReply, VoiceAdded,
                                              VoiceRemoved, VoicesReply, Error)}


# --- framing


def encode(msg: Message, pcm: Buffer | None = None) -> list[Buffer]:
    """The frames of `msg`: its msgpack header, then `pcm`, its binary frame (audio's PCM, speak's
    media), when the message has one.

    `pcm` may be any contiguous buffer (bytes, a memoryview of a numpy array); it is not copied.
    Fields that are None are left out. The header is checked as `decode` would, so a bad message
    fails here, at the sender, with the same reason.
    """
    if isinstance(msg, StatusReply):
        if "op" in msg.fields:
            raise ProtocolError("status reply fields must not contain 'op'")
        header = {"op": msg.op, **msg.fields}
    else:
        header = {"op": msg.op}
        header.update({f.name: v for f in dataclasses.fields(msg) if (v := getattr(msg, f.name)) is not None})
    pcm_bytes = None if pcm is None else memoryview(pcm).nbytes
    table = REPLIES if isinstance(msg, tuple(REPLIES.values())) else REQUESTS
    _validate(table, header, 1 if pcm is None else 2, pcm_bytes)
    try:
        frames: list[Buffer] = [msgpack.packb(header, use_bin_type=True)]
    except (TypeError, ValueError, OverflowError) as e:  # e.g. a numpy scalar in a report
        raise ProtocolError(f"{msg.op}: cannot encode: {e}", header.get("id")) from e
    if pcm is not None:
        frames.append(pcm)
    return frames


def decode(frames: Sequence[bytes], *,
           max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[Request, bytes | None]:
    """The client -> server message in `frames` (the ROUTER's identity frame already stripped), with
    its binary frame (speak's media) or None.

    Raises ProtocolError(reason, id) with the id echoed when the header had a readable one.
    The size limit is checked before anything is unpacked.
    """
    if not frames:
        raise ProtocolError("empty message: no frames")
    size = sum(len(f) for f in frames)
    if size > max_bytes:
        raise ProtocolError(f"message too large: {size} bytes (max {max_bytes})")
    header = _unpack(frames[0])
    blob = bytes(frames[1]) if len(frames) == 2 else None
    return _validate(REQUESTS, header, len(frames), None if blob is None else len(blob)), blob


def decode_reply(frames: Sequence[bytes]) -> tuple[Reply, bytes | None]:
    """The server -> client message in `frames`, with its PCM (bytes for `audio`, else None)."""
    if not frames:
        raise ProtocolError("empty message: no frames")
    header = _unpack(frames[0])
    pcm = bytes(frames[1]) if len(frames) == 2 else None
    return _validate(REPLIES, header, len(frames), None if pcm is None else len(pcm)), pcm


def summary(frames: Sequence[Buffer]) -> str:
    """A message's op and id for a log line, e.g. "audio for 'r1'"."""
    try:
        header = _unpack(bytes(frames[0]))
    except ProtocolError as exc:
        return f"a message ({exc.reason})"
    return f"{header.get('op')} for {header['id']!r}" if "id" in header else str(header.get("op"))


def _unpack(frame: bytes) -> dict:
    if len(frame) == 0:
        raise ProtocolError("empty header frame (the first frame must be the msgpack header; "
                            "there is no delimiter frame)")
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except msgpack.ExtraData:
        raise ProtocolError("header is not valid msgpack: extra bytes after the first object") from None
    except msgpack.StackError:
        raise ProtocolError("header is not valid msgpack: nested too deeply") from None
    except Exception as e:
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise ProtocolError(f"header is not valid msgpack: {detail}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {describe(header)}")
    return header


def _validate(table: dict[str, type], header: dict, num_frames: int, pcm_bytes: int | None) -> Any:
    """Check `header` against its op's field table and build the message."""
    id = header.get("id") if is_id(header.get("id")) else None
    try:
        if "op" not in header:
            raise ProtocolError("header has no 'op' field")
        op = header["op"]
        if not isinstance(op, str):
            raise ProtocolError(f"'op' must be a string, got {describe(op)}")
        if op not in table:
            raise ProtocolError(f"unknown op {op!r} (known: {', '.join(table)})")
        cls = table[op]
        if num_frames > 2:
            raise ProtocolError(f"too many frames: {num_frames} (a message is one header frame, "
                                "optionally followed by one binary frame)")
        if cls is StatusReply:
            return StatusReply(fields={k: v for k, v in header.items() if k != "op"})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in header:
            if name != "op" and name not in fields:
                raise ProtocolError(f"{op}: unknown field {name!r} (fields: {', '.join(fields) or 'none'})")
        values = {}
        for name, f in fields.items():
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if name not in header and required:
                raise ProtocolError(f"{op}: missing field {name!r}")
            if name not in header or (header[name] is None and not required):  # nil: the default
                continue
            f.metadata["check"](header[name], f"{op}.{name}")
            values[name] = header[name]
        msg = cls(**values)
        _check_frame(msg, pcm_bytes)
        return msg
    except ProtocolError as e:
        raise ProtocolError(e.reason, id) from None


def _check_frame(msg: Message, got: int | None) -> None:
    """The binary frame is there exactly when the header says it is, with the size it says."""
    want = msg.frame_bytes() if isinstance(msg, (Audio, Speak, VoiceAdd)) else None
    if want is None:
        if got is not None:
            carries = " (speak carries one only with media)" if isinstance(msg, Speak) else ""
            raise ProtocolError(f"unexpected binary frame: {msg.op} carries none{carries}")
        return
    what = (f"{msg.samples} samples of {msg.format}" if isinstance(msg, (Audio, VoiceAdd))
            else f"media {msg.media['dtype']} {msg.media['shape']}")  # type: ignore[union-attr,index]
    if got is None:
        raise ProtocolError(f"{msg.op}: missing the binary frame ({what})")
    if got != want:
        raise ProtocolError(f"{msg.op}: binary frame has {got} bytes, expected {want} ({what})")


__all__ = [
    "Accepted",
    "Ack",
    "Audio",
    "BYTES_PER_SAMPLE",
    "Buffer",
    "Cancel",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DONE_REASONS",
    "Done",
    "Error",
    "FORMATS",
    "History",
    "HistoryReply",
    "Id",
    "MAX_ID_CHARS",
    "MEDIA_DTYPES",
    "Message",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "ROLES",
    "Rejected",
    "Reply",
    "Request",
    "SAMPLING_KEYS",
    "Speak",
    "Status",
    "StatusReply",
    "TEXT_FILTERS",
    "Text",
    "Turn",
    "VoiceAdd",
    "VoiceAdded",
    "VoiceRemove",
    "VoiceRemoved",
    "Voices",
    "VoicesReply",
    "decode",
    "decode_reply",
    "encode",
    "is_id",
]
