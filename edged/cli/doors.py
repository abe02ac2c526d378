"""`edged wyoming` and `edged http`: the front doors, each its own process, a client of the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from edged.cli.client_commands import _endpoint
from edged.locate import preferred_endpoint

log = logging.getLogger("edged.doors")

MISSING = "the front doors need their packages (the doors extra): .venv/bin/pip install -e '.[doors]' in edged's checkout"
LOCAL_URI, NETWORK_URI = "tcp://127.0.0.1:10200", "tcp://0.0.0.0:10200"


def wyoming_uri(uri: str | None, zeroconf: str | None) -> str:
    """Where `edged wyoming` listens: --uri, else this machine only, or every interface when the
    service is advertised on the network (an advertised loopback address reaches no other machine)."""
    if uri is not None:
        return uri
    return NETWORK_URI if zeroconf is not None else LOCAL_URI


def add_parser(commands) -> None:
    p = commands.add_parser("wyoming", help="serve the daemon as a Wyoming TTS service (Home Assistant)")
    p.add_argument("--uri", default=None, help=f"where to listen: tcp://HOST:PORT or unix://PATH (default: {LOCAL_URI}; "
                                                f"with --zeroconf {NETWORK_URI}, so that what is advertised can be reached)")
    p.add_argument("--zeroconf", nargs="?", const="edged", default=None, metavar="NAME",
                   help="advertise the service over mDNS (_wyoming._tcp) as NAME (default: edged), for discovery")
    p.add_argument("--play-local", action="store_true",
                   help="play on the daemon's speaker instead of sending the audio to the Wyoming client")
    _common(p)
    p.set_defaults(run=refusing(wyoming))

    p = commands.add_parser("http", help="serve OpenAI's speech API (/v1/audio/speech) in front of the daemon")
    p.add_argument("--listen", default="127.0.0.1:8880", help="HOST:PORT to listen on (default: 127.0.0.1:8880)")
    p.add_argument("--text-filter", default="none", choices=("llm", "none"),
                   help="what a request without its own text_filter gets: llm drops <think> blocks and markdown "
                        "(an LLM's text), none speaks the input as sent (default: none, as OpenAI's API)")
    p.add_argument("--api-key-file", type=Path, default=None,
                   help="a file holding the API key clients must send (Authorization: Bearer KEY)")
    _common(p)
    p.set_defaults(run=refusing(http))


def _common(p: argparse.ArgumentParser) -> None:
    _endpoint(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"), help="(default: info)")


class Refused(Exception):
    """A front door that cannot start; the message says why (exit 2)."""


def refusing(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`command`, with its packages missing or a bad option printed as `edged NAME: what`, exit 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ImportError as exc:
            print(f"edged {args.command}: {MISSING} ({exc})", file=sys.stderr)
        except Refused as exc:
            print(f"edged {args.command}: {exc}", file=sys.stderr)
        return 2
    return run


def _link(args: argparse.Namespace):
    from edged.doors.link import DaemonLink

    try:
        return DaemonLink(args.endpoint or preferred_endpoint(), timeout_s=args.timeout, server_key=args.server_key,
                          certificate=args.client_cert)
    except ValueError as exc:  # a key file that cannot be used
        raise Refused(exc) from None


def _logging(args: argparse.Namespace) -> None:
    from edged.systemd.logging import setup_logging

    setup_logging(args.log_level)


def wyoming(args: argparse.Namespace) -> int:
    from wyoming.server import AsyncServer

    from edged.doors.wyoming import WyomingDoor

    args.uri = wyoming_uri(args.uri, args.zeroconf)
    uri = urlparse(args.uri)
    if args.zeroconf is not None and uri.scheme != "tcp":
        raise Refused(f"--zeroconf needs a tcp:// --uri, not {args.uri}")
    link = _link(args)
    _logging(args)

    async def serve() -> None:
        await link.start()
        door = WyomingDoor(link, play_local=args.play_local)
        server = AsyncServer.from_uri(args.uri)
        if args.zeroconf is not None:
            from wyoming.zeroconf import HomeAssistantZeroconf
            from zeroconf import NonUniqueNameException

            host = uri.hostname if uri.hostname not in (None, "0.0.0.0", "") else None
            if host is not None and host.startswith("127."):
                log.warning("advertising %s over mDNS: only this machine can reach it (listen on tcp://0.0.0.0:PORT "
                            "for Home Assistant on another machine)", host)
            try:
                await HomeAssistantZeroconf(port=uri.port or 10200, name=args.zeroconf, host=host).register_server()
            except NonUniqueNameException:
                raise SystemExit(f"edged wyoming: another service is advertised as {args.zeroconf!r} on this "
                                 "network: choose another --zeroconf NAME") from None
            log.info("advertised over mDNS as %s._wyoming._tcp.local.", args.zeroconf)
        log.info("wyoming: listening on %s, speaking through %s", args.uri, link.endpoint)
        try:
            await server.run(door.handler)
        finally:
            await link.close()

    asyncio.run(serve())
    return 0


def http(args: argparse.Namespace) -> int:
    import uvicorn

    from edged.doors.http import HttpDoor, app

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise Refused(f"--listen takes HOST:PORT, not {args.listen!r}")
    api_key = None
    if args.api_key_file is not None:
        try:
            api_key = args.api_key_file.read_text().strip()
        except OSError as exc:
            raise Refused(f"--api-key-file {args.api_key_file}: {exc.strerror or exc}") from None
        if not api_key:
            raise Refused(f"--api-key-file {args.api_key_file} is empty")
    door = HttpDoor(_link(args), api_key=api_key, text_filter=args.text_filter)
    _logging(args)
    log.info("http: listening on %s, speaking through %s%s", args.listen, door.link.endpoint,
             " (API key required)" if api_key else "")
    # uvicorn stops gracefully on SIGTERM, then raises it again under the handler it found: let that
    # be a no-op, so a stop is exit 0 (as `edged wyoming` and the daemon)
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app(door), host=host.strip("[]"), port=int(port), log_level=args.log_level, access_log=False,
                log_config=None)
    return 0
