"""`edged say`, `edged cancel`, `edged status`, `edged history`: small clients of a running daemon."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from edged.cpu import Cpu
from edged.locate import NoDaemon, candidates, daemon_endpoint

EXIT_FAILED = 1
EXIT_REJECTED = 2


def add_parser(commands) -> None:
    p = commands.add_parser("say", help="speak TEXT through the running daemon and print the report")
    p.add_argument("text", help="the text; \"-\": read standard input and speak it as it comes (e.g. piped from an LLM)")
    p.add_argument("--voice", default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--instruct", default=None)
    p.add_argument("--session", default=None, help="the conversation whose history the reply joins (edged history)")
    p.add_argument("--out", type=Path, default=None, help="also stream the audio back and write it to a WAV file")
    p.add_argument("--no-play", action="store_true", help="do not play on the daemon's speaker")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-audio-ms", type=int, default=None)
    _endpoint(p)
    p.set_defaults(run=reached(say))

    p = commands.add_parser("cancel", help="cancel the requests in flight with this id, whichever client sent them (as "
                                             "`edged status` lists ids)")
    p.add_argument("id")
    _endpoint(p)
    p.set_defaults(run=reached(cancel))

    p = commands.add_parser("history", help="show a session's history (turns oldest first); --add appends a turn first")
    p.add_argument("session")
    p.add_argument("--add", nargs=2, metavar=("ROLE", "TEXT"), default=None,
                   help="append a turn first: ROLE user, system or assistant")
    p.add_argument("--wait", action="store_true", help="first let pending calibrations finish (one bounded deadline)")
    p.add_argument("--close", action="store_true", help="then release the session's cursors and recordings")
    p.add_argument("--json", action="store_true", help="print the turns as a JSON array")
    _endpoint(p)
    p.set_defaults(run=reached(history))

    p = commands.add_parser("status", help="show the daemon's status")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for a daemon to answer (one still booting, or just started with &)")
    _endpoint(p)
    p.set_defaults(run=reached(status))


def _endpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", default=None,
                   help=f"daemon endpoint (default: the first of {', '.join(map(str, candidates()))} a daemon listens on)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the daemon (default: 60)")
    p.add_argument("--server-key", default=None,
                   help="tcp:// with CURVE: the daemon's public key, Z85 or its .key file (default: $EDGED_SERVER_KEY)")
    p.add_argument("--client-cert", default=None,
                   help="tcp:// with CURVE: this client's certificate, its .key_secret file (default: $EDGED_CLIENT_CERT)")


def reached(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`command`, with a daemon it cannot reach (none listening, no answer in --timeout, a key it cannot
    use, a protocol error) printed as `edged NAME: what` and exit code 1."""
    def run(args: argparse.Namespace) -> int:
        from edged.protocol import ProtocolError

        try:
            return command(args)
        except (NoDaemon, TimeoutError, ValueError, ProtocolError) as exc:
            print(f"edged {args.command}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    return run


def _client(args: argparse.Namespace):
    from edged.client import Client

    return Client(daemon_endpoint(args.endpoint), timeout_s=args.timeout, server_key=args.server_key,
                  certificate=args.client_cert)


def say(args: argparse.Namespace) -> int:
    from edged.audio.wav import write_wav
    from edged.client import RequestRejected

    sampling = {"seed": args.seed} if args.seed is not None else None
    with _client(args) as client:
        options = dict(voice=args.voice, language=args.language, instruct=args.instruct, session=args.session,
                       play=not args.no_play,
                       stream=args.out is not None, sampling=sampling, max_audio_ms=args.max_audio_ms)
        if args.text == "-":  # standard input, spoken as it comes
            utterance = client.speak_iter(stdin_pieces(), **options)
        else:
            utterance = client.speak(args.text, **options)
        try:
            done = utterance.wait()
        except RequestRejected as exc:
            print(f"edged say: rejected: {exc.reason}", file=sys.stderr)
            return EXIT_REJECTED
    if args.out is not None:
        write_wav(args.out, utterance.pcm, utterance.sample_rate or 24000)
    print(json.dumps({"id": done.id, "reason": done.reason, "error": done.error, **done.report}))
    return 0 if done.reason in ("eos", "length") else EXIT_FAILED


def stdin_pieces() -> Iterator[str]:
    """Standard input as it arrives (whatever each read returns), decoded as UTF-8 across reads."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(sys.stdin.fileno(), 4096):
        if text := decoder.decode(chunk):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


def cancel(args: argparse.Namespace) -> int:
    """Cancel the requests in flight with this id, of any client (as `edged status` lists them); the
    status that follows shows that the daemon took the cancel (none answering: exit 1)."""
    with _client(args) as client:
        client.cancel(args.id, any_client=True)
        client.status()
    return 0


def history(args: argparse.Namespace) -> int:
    """The session's turns, one a line (`role: content`, marked when the reply was cut or its heard
    text is still being estimated), or as JSON."""
    with _client(args) as client:
        if args.add is not None:
            client.turn(args.session, *args.add)
        turns = client.history(args.session, wait=args.wait, close=args.close)
    if args.json:
        print(json.dumps(turns, ensure_ascii=False))
        return 0
    for turn in turns:
        marks = [m for m in ("interrupted", "pending") if turn.get(m)]
        print(f"{turn['role']}: {turn['content']}" + (f"  [{', '.join(marks)}]" if marks else ""))
    return 0


def status(args: argparse.Namespace) -> int:
    s = _status(args, time.monotonic() + args.wait)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(format_status(s))
    return 0


def _status(args: argparse.Namespace, deadline: float) -> dict:
    """The daemon's status; until `deadline`, a daemon not found or not answering yet is asked again
    (its socket appears when its boot is done)."""
    while True:
        try:
            with _client(args) as client:
                return client.status()
        except (NoDaemon, TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _speaker(out: dict) -> str:
    if out["state"] != "open":
        return out["state"] + (f" ({out['error']})" if out.get("error") else "")
    playing = ", ".join(f"{r['id']} at {r['played_ms']} ms" for r in out["replies"]) or "idle"
    return (f"{out['device']} at {out['device_rate']} Hz, {playing}; {out['underruns']} underruns, "
            f"{out['lost']} lost")


def _microphone(inp: dict) -> str:
    if inp["state"] != "open":
        return inp["state"] + (f" ({inp['error']})" if inp.get("error") else "")
    echo = f"echo cancelled {inp['echo_erle_db']} dB" if inp["echo_cancel"] else "no echo cancelling"
    return (f"{inp['device']} at {inp['rate']} Hz, {echo}, barge-in {'on' if inp['barge_in'] else 'off'}; "
            f"{inp['speech_starts']} speech starts, {inp['barge_ins']} barge-ins")


INSTRUCT_MEANS = {"style": "a style instruction (how the voice speaks)",
                  "voice": "a description of the voice to speak in",
                  "none": "refused"}
"""status.model.instruct_means, in words."""


def _model(m: dict) -> str:
    speakers = f"{len(m['speakers'])} speakers" + (f" ({len(m['speaker_dialects'])} with a dialect)"
                                                   if m["speaker_dialects"] else "")
    languages = f"{len(m['languages'])} languages" + (f" ({len(m['dialects'])} dialects)" if m["dialects"] else "")
    return (f"{m['type']}: {speakers}, {languages}, instruct {m['instruct_means']}, "
            f"cloning {'yes' if m['clone'] else 'no'}, longest reply {m['max_reply_ms'] / 1000:.1f} s")


def _history(h: dict) -> str:
    if h.get("state") == "unavailable":  # no history: {state, error, path}
        return f"unavailable ({h.get('error')})"
    state = "" if h["state"] == "ok" else f"{h['state']} ({h['errors']} refused: {h['last_error']}), "
    return (f"{state}policy {h['policy']}, {h['replies']} replies tracked, {h['calibrating']} calibrating, "
            f"{h['retained_bytes']} bytes of audio kept ({h['path']})")


def _backend(b: dict) -> str:
    graphs = b["cuda_graphs"]
    if not graphs["enabled"]:
        return b["name"] if b["name"] != "tensorrt" else f"{b['name']}, CUDA graphs off (daemon.cuda_graphs)"
    failed = "".join(f"; NOT CAPTURED {f['plan']}: {f['why']}" for f in graphs["failed"])
    return f"{b['name']}, {graphs['captured']} of {graphs['marked']} step plans replayed as CUDA graphs{failed}"


def format_status(s: dict) -> str:
    cohort, queue, counters = s["cohort"], s["queue"], s["counters"]
    done = ", ".join(f"{k} {v}" for k, v in counters["done"].items())
    members = f": {', '.join(cohort['members'])}" if cohort["members"] else ""
    rows = [
        ("state", s["state"]),
        ("uptime", f"{s['uptime_s']:.1f} s"),
        ("artifact", f"{s['artifact']} ({s['family']})"),
        ("model", _model(s["model"])),
        ("cpu", Cpu(s["cpu"]["model"], s["cpu"]["arch"], tuple(s["cpu"]["features"]), s["cpu"]["int8_products"]).line()),
        ("vocoder", f"{s['vocoder']['weights']} ({s['vocoder']['why']})"),
        ("backend", _backend(s["backend"])),
        ("cohort", f"{cohort['running']}/{cohort['max_batch']} members{members}"),
        ("queue", f"{queue['waiting']} waiting (limit {queue['limit']})"),
        ("requests", f"{counters['accepted']} accepted, {counters['rejected']} rejected"),
        ("done", done),
        ("frames", f"{counters['frames']} in {counters['steps']} steps"),
        ("speaker", _speaker(s["audio"]["output"])),
        ("microphone", _microphone(s["audio"]["input"])),
        ("history", _history(s.get("history", {}))),
    ]
    rows += [(f"memory {part}", f"{size / 2**20:.2f} MiB") for part, size in s["memory"].items()]
    rows.append(("memory total", f"{sum(s['memory'].values()) / 2**20:.2f} MiB"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
