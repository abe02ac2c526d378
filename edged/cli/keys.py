"""`edged keys`: CURVE certificates for the daemon's tcp:// sockets.

    edged keys init DIR               # DIR/server.key(_secret), DIR/authorized/, DIR/clients/
    edged keys client DIR NAME        # DIR/clients/NAME.key(_secret), authorized
    edged keys authorize DIR FILE     # a client's public certificate (made elsewhere) into DIR/authorized/

Certificates are `zmq.auth.create_certificates` files; secret ones get mode 0600. The daemon reads
DIR/server.key_secret (`daemon.curve_secret_key`) and DIR/authorized (`daemon.curve_authorized_dir`)
at boot, so restart it after authorizing a client.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def add_parser(commands) -> None:
    p = commands.add_parser("keys", help="make CURVE certificates for tcp:// (server, clients) and authorize clients")
    actions = p.add_subparsers(dest="action", required=True)
    init = actions.add_parser("init", help="make the daemon's certificate and the authorized-clients directory")
    init.add_argument("dir", type=Path)
    client = actions.add_parser("client", help="make a client certificate and authorize it")
    client.add_argument("dir", type=Path)
    client.add_argument("name", help="letters, digits, _ . - (up to 64)")
    authorize = actions.add_parser("authorize", help="authorize a client's public certificate (its .key file)")
    authorize.add_argument("dir", type=Path)
    authorize.add_argument("certificate", type=Path)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        print({"init": init, "client": client, "authorize": authorize}[args.action](args))
    except (ValueError, OSError) as exc:
        print(f"edged keys: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def init(args: argparse.Namespace) -> str:
    d: Path = args.dir
    if (d / "server.key_secret").exists():
        raise ValueError(f"{d / 'server.key_secret'} exists: keys are made once (remove the directory to start over)")
    public, secret = _create(d, "server")
    (d / "authorized").mkdir(mode=0o750, exist_ok=True)
    (d / "clients").mkdir(mode=0o700, exist_ok=True)
    return (f"server certificate: {secret} (secret, for the daemon) and {public} (public, for clients)\n"
            f"in edged.toml [daemon]:\n"
            f"curve_secret_key = \"{secret.resolve()}\"\n"
            f"curve_authorized_dir = \"{(d / 'authorized').resolve()}\"\n"
            f"then authorize clients: edged keys client {d} NAME")


def client(args: argparse.Namespace) -> str:
    d, name = args.dir, args.name
    if not NAME.fullmatch(name):
        raise ValueError(f"client name {name!r}: use letters, digits, _ . - (up to 64, not starting with . - _)")
    _need_init(d)
    if (d / "clients" / f"{name}.key_secret").exists():
        raise ValueError(f"{d / 'clients' / (name + '.key_secret')} exists: pick another name")
    public, secret = _create(d / "clients", name)
    shutil.copyfile(public, d / "authorized" / public.name)
    return (f"client certificate: {secret} (give it to the client: --client-cert, $EDGED_CLIENT_CERT), "
            f"authorized as {d / 'authorized' / public.name}; the daemon's public key: {d / 'server.key'} "
            f"(--server-key, $EDGED_SERVER_KEY). Restart the daemon to admit it.")


def authorize(args: argparse.Namespace) -> str:
    from edged.server.curve import load_certificate

    d, certificate = args.dir, args.certificate
    _need_init(d)
    load_certificate(certificate)  # a readable certificate, or a named error
    target = d / "authorized" / (certificate.stem + ".key")
    if target.exists():
        raise ValueError(f"{target} exists: a client of that name is already authorized")
    target.write_text(_public_part(certificate.read_text()))
    return f"authorized {target}; restart the daemon to admit it"


def _create(d: Path, name: str) -> tuple[Path, Path]:
    import zmq.auth

    d.mkdir(parents=True, exist_ok=True)
    public, secret = (Path(p) for p in zmq.auth.create_certificates(str(d), name))
    secret.chmod(0o600)
    return public, secret


def _need_init(d: Path) -> None:
    if not (d / "server.key_secret").is_file() or not (d / "authorized").is_dir():
        raise ValueError(f"{d}: no keys here; run `edged keys init {d}` first")


def _public_part(text: str) -> str:
    """A certificate without its secret key (a .key_secret given to `authorize` stays secret)."""
    return "".join(line for line in text.splitlines(keepends=True) if "secret-key" not in line)
