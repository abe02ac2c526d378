"""`edged converse`: a voice assistant on the daemon: hear, transcribe, answer with an LLM, speak
(edged/converse/loop.py, docs/converse.md)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from edged.converse.loop import Converse, Settings
from edged.locate import NoDaemon
from edged.stopped import ignore_stop_signals


def add_parser(commands) -> None:
    p = commands.add_parser("converse", help="listen on the daemon's microphone, transcribe each turn, let an LLM "
                                             "answer and speak it (Ctrl-C stops)")
    p.add_argument("--asr-url", required=True,
                   help="an OpenAI-compatible transcription endpoint, e.g. http://127.0.0.1:8080/v1/audio/transcriptions")
    p.add_argument("--asr-model", default="whisper-1", help="the model the transcription endpoint takes (default: whisper-1)")
    p.add_argument("--llm-url", required=True,
                   help="an OpenAI-compatible chat completions endpoint, e.g. http://127.0.0.1:8000/v1/chat/completions")
    p.add_argument("--llm-model", required=True)
    p.add_argument("--api-key-file", type=Path, default=None, help="the LLM's key (sent as a bearer token)")
    p.add_argument("--session", default="converse", help="the daemon's history session (default: converse)")
    p.add_argument("--system", default=None, help="the LLM's system message")
    p.add_argument("--voice", default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--wake", default=None, metavar="PHRASE",
                   help="answer only a turn that holds PHRASE (then every turn for --awake-s)")
    p.add_argument("--awake-s", type=float, default=30.0, help="how long a wake phrase keeps it answering (default: 30)")
    p.add_argument("--end-silence-ms", type=int, default=600,
                   help="silence after speech that ends the user's turn (default: 600)")
    p.add_argument("--preroll-ms", type=int, default=300,
                   help="audio kept from before the VAD's start, the first syllable (default: 300)")
    p.add_argument("--endpoint", default=None, help="the daemon (default: found as the other commands find it)")
    p.add_argument("--events", default=None, help="the daemon's event socket (default: the one its status names)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        api_key = args.api_key_file.read_text().strip() if args.api_key_file else None
    except OSError as exc:
        print(f"edged converse: --api-key-file {args.api_key_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    settings = Settings(args.asr_url, args.asr_model, args.llm_url, args.llm_model, session=args.session,
                        system=args.system, voice=args.voice, language=args.language, wake=args.wake,
                        awake_s=args.awake_s, preroll_ms=args.preroll_ms, end_silence_ms=args.end_silence_ms,
                        api_key=api_key, endpoint=args.endpoint, events=args.events)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        converse = Converse(settings, say=lambda line: print(line, flush=True))
        print(f"edged converse: listening (session {settings.session!r}"
              + (f", wake phrase {settings.wake!r}" if settings.wake else "") + "); Ctrl-C stops", flush=True)
        converse.run(stop)
        ignore_stop_signals()
    except (ValueError, NoDaemon, ConnectionError, TimeoutError) as exc:
        print(f"edged converse: {exc}", file=sys.stderr)
        return 2
    return 0
