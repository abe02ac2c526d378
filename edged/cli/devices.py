"""`edged devices`: this machine's audio devices as PortAudio lists them, named as the config takes them.

`audio.device` / `--audio-device` and `audio.input_device` / `--input-device` take a device's index
or its name, matched as sounddevice matches names (space-separated pieces of "name, host API", case
ignored; an exact name wins over other matches). A device's `select` (the name column of the table)
is the first of these that picks exactly that device: its name, else "name, host API", else its
index. No daemon is asked: the list is what PortAudio sees in this process, as a daemon started now
would see it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edged.audio.portaudio import missing, sounddevice

EXIT_NO_PORTAUDIO = 2


def add_parser(commands) -> None:
    p = commands.add_parser("devices", help="list this machine's audio devices (PortAudio's) with the index and name "
                                            "audio.device and audio.input_device take")
    p.add_argument("--json", action="store_true", help="print {devices, default_input, default_output} as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    why = missing()
    if why:
        print(f"edged devices: {why}", file=sys.stderr)
        return EXIT_NO_PORTAUDIO
    listing = devices(sounddevice())
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    print(table(listing["devices"]))
    print('\naudio.device / --audio-device (speaker) and audio.input_device / --input-device (microphone) take '
          'the index or the name shown; "" = the default, "none" = no device.')
    return 0


def devices(sd: Any) -> dict[str, Any]:
    """Every device PortAudio lists, and the indices of its default input and output (None: none)."""
    apis = [api["name"] for api in sd.query_hostapis()]
    defaults = {kind: _default(sd, kind) for kind in ("input", "output")}
    out = []
    for info in sd.query_devices():
        index, name, api = int(info["index"]), str(info["name"]), apis[info["hostapi"]]
        inputs, outputs = int(info["max_input_channels"]), int(info["max_output_channels"])
        kinds = [k for k, n in (("input", inputs), ("output", outputs)) if n > 0]
        out.append({"index": index, "name": name, "hostapi": api, "select": _select(sd, index, name, api, kinds),
                    "input_channels": inputs, "output_channels": outputs,
                    "default_samplerate": float(info["default_samplerate"]),
                    "default_input": index == defaults["input"], "default_output": index == defaults["output"]})
    return {"devices": out, "default_input": defaults["input"], "default_output": defaults["output"]}


def _default(sd: Any, kind: str) -> int | None:
    """PortAudio's default device of `kind` (it says "Error querying device -1" when there is none)."""
    try:
        return int(sd.query_devices(kind=kind)["index"])
    except (sd.PortAudioError, ValueError):
        return None


def _select(sd: Any, index: int, name: str, api: str, kinds: list[str]) -> str:
    """What the config names this device by: the first of name, "name, host API" that sounddevice
    resolves to this device for each stream it has, else the index."""
    for query in (name, f"{name}, {api}"):
        if query.isdigit():  # the config reads digits as an index
            continue
        try:
            if all(int(sd.query_devices(query, kind)["index"]) == index for kind in kinds):
                return query
        except ValueError:  # no match, or several that none names exactly
            continue
    return str(index)


def table(devices: list[dict[str, Any]]) -> str:
    if not devices:
        return "PortAudio lists no audio devices"
    rows = [("index", "name", "host API", "in", "out", "rate", "default")]
    for d in devices:
        default = ", ".join(k for k in ("input", "output") if d[f"default_{k}"])
        rows.append((str(d["index"]), d["select"], d["hostapi"], str(d["input_channels"]), str(d["output_channels"]),
                     f"{d['default_samplerate']:g}", default))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
