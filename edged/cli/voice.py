"""`edged voice add|list|remove`: enrolled voices of a running daemon (a Base artifact).

`add NAME --audio REF.wav` sends a recording; `add NAME --record SECONDS` records the daemon's own
microphone instead: the `mic` events of its event socket (16 kHz, echo-cancelled, as the daemon
hears it), from the moment the command starts. Either is cloned in context with `--ref-text`
(what the recording says), from its x-vector only without. `list` first says what the model takes
(`status.model`: languages and dialects, instructions, cloning, the longest reply).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from edged.cli.client_commands import EXIT_FAILED, INSTRUCT_MEANS, _client, _endpoint, reached


def add_parser(commands) -> None:
    p = commands.add_parser("voice", help="enroll, list and remove cloned voices of the running daemon")
    sub = p.add_subparsers(dest="voice_command", required=True)
    a = sub.add_parser("add", help="enroll a voice cloned from a recording")
    a.add_argument("name", help="the voice's name (1-48 of a-z, 0-9, _ . -); speak with --voice NAME")
    source = a.add_mutually_exclusive_group(required=True)
    source.add_argument("--audio", type=Path, help="a PCM WAV recording (1-30 s of one speaker)")
    source.add_argument("--record", type=float, metavar="SECONDS",
                        help="record this long from the daemon's microphone (its event socket's mic audio)")
    a.add_argument("--ref-text", default=None, help="what the recording says: clone in context (ICL)")
    a.add_argument("--events", default=None, help="--record: the daemon's event socket (default: the one its status names)")
    _endpoint(a)
    a.set_defaults(run=reached(add))
    ls = sub.add_parser("list", help="what the model takes (languages, instruct, cloning, the longest reply), then "
                                     "the voices a speak may name")
    ls.add_argument("--json", action="store_true", help="print {model (as status has it), voices} as JSON")
    _endpoint(ls)
    ls.set_defaults(run=reached(list_voices))
    r = sub.add_parser("remove", help="remove an enrolled voice")
    r.add_argument("name")
    _endpoint(r)
    r.set_defaults(run=reached(remove))


def add(args: argparse.Namespace) -> int:
    from edged.audio.wav import read_wav

    if args.audio is not None:
        try:
            pcm, rate = read_wav(args.audio)
        except OSError as exc:
            print(f"edged voice: {args.audio}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    with _client(args) as client:
        if args.audio is None:
            pcm, rate = record(args, args.events or client.status()["events"]), 16000
        voice = client.voice_add(args.name, pcm, rate, ref_text=args.ref_text)
    print(json.dumps(voice))
    return 0


def record(args: argparse.Namespace, endpoint: str | None) -> np.ndarray:
    """`args.record` seconds of the daemon's microphone, from the `mic` events of its event socket at
    `endpoint` (16 kHz s16le)."""
    import msgpack

    from edged.audio.wav import from_s16
    from edged.client import subscribe

    if not endpoint:
        raise ValueError("the daemon's event socket is off (events.listen = \"none\"): --record needs it")
    if args.record <= 0:
        raise ValueError("--record needs a positive number of seconds")
    socket = subscribe(endpoint, ("mic",), server_key=args.server_key, certificate=args.client_cert)
    want, chunks, got = int(args.record * 16000), [], 0
    deadline = time.monotonic() + args.record + args.timeout
    try:
        while got < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the microphone sent {got / 16000:.1f} of {args.record:g} s (is it open? "
                                   f"events.mic_audio must be true)")
            if not socket.poll(1000):
                continue
            frames = socket.recv_multipart()
            if msgpack.unpackb(frames[1]).get("event") == "mic" and len(frames) > 2:
                chunks.append(from_s16(frames[2]))
                got += len(chunks[-1])
    finally:
        socket.close(linger=0)
    return np.concatenate(chunks)[:want]


def list_voices(args: argparse.Namespace) -> int:
    """What the model takes (status.model), then the voices a speak may name."""
    with _client(args) as client:
        model = client.status()["model"]
        voices = client.voices()
    if args.json:
        print(json.dumps({"model": model, "voices": voices}, indent=2))
        return 0
    for key, value in takes(model):
        print(f"{key:10} {value}")
    print()
    for v in voices:
        detail = (f"{v['mode']}, {v['reference_ms'] / 1000:.1f} s reference" if v["kind"] == "enrolled"
                  else "built-in" + (f", dialect {v['dialect']}" if v.get("dialect") else ""))
        print(f"{v['name']:24} {detail}")
    return 0


def takes(model: dict) -> list[tuple[str, str]]:
    """status.model as lines: languages and dialects, instructions, cloning, the longest reply."""
    dialects = model["dialects"]
    languages = ["auto", *(name for name in model["languages"] if name not in dialects)]
    rows = [("model", model["type"]), ("languages", ", ".join(languages))]
    if dialects:
        rows.append(("dialects", ", ".join(dialects) + " (a language; a dialect speaker speaks its own with "
                                                       "language chinese or auto)"))
    rows.append(("instruct", INSTRUCT_MEANS.get(model["instruct_means"], model["instruct_means"])))
    rows.append(("cloning", "yes: edged voice add NAME --audio REF.wav" if model["clone"] else
                 "no: this artifact has no clone encoder (export a Base checkpoint)"))
    rows.append(("longest", f"{model['max_reply_ms'] / 1000:.1f} s a reply (the KV cache's {model['max_seq']} rows "
                            f"less the shortest prompt's {model['fixed_rows']}; a longer prompt leaves less)"))
    return rows


def remove(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.voice_remove(args.name)
    return 0
