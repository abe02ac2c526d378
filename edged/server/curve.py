"""CURVE on TCP: the daemon's certificate, the ZAP authenticator that admits only authorized
clients, and a client's keys.

Certificates are the files `zmq.auth.create_certificates` writes: NAME.key (the public key) and
NAME.key_secret (public and secret). The daemon reads its own NAME.key_secret
(`daemon.curve_secret_key`) and admits a client whose public key is among the certificates in
`daemon.curve_authorized_dir` (read at boot); any other client gets no connection at all (the
handshake fails, so it never learns whether a daemon is there). pyzmq's `ThreadAuthenticator`
answers ZAP for every socket of the daemon's context. ipc:// sockets are guarded by file modes
instead (edged/server/sockets.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("edged.server")

KEY_LENGTH = 40
"""A Z85-encoded CURVE key."""


class CurveError(ValueError):
    """A key or certificate that cannot be used; the message names the file."""


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    authorized_dir: Path

    def options(self) -> dict[int, Any]:
        """Socket options of a CURVE server socket."""
        return {zmq.CURVE_SERVER: 1, zmq.CURVE_PUBLICKEY: self.public, zmq.CURVE_SECRETKEY: self.secret}


def load_server_keys(secret_file: str | Path, authorized_dir: str | Path) -> ServerKeys:
    """The daemon's certificate and its directory of authorized client certificates."""
    public, secret = load_certificate(secret_file, need_secret=True)
    authorized = Path(authorized_dir)
    if not authorized.is_dir():
        raise CurveError(f"{authorized}: the authorized client certificates directory does not exist")
    return ServerKeys(public, secret, authorized)  # type: ignore[arg-type]


def load_certificate(path: str | Path, need_secret: bool = False) -> tuple[bytes, bytes | None]:
    """(public, secret) of a certificate file; secret is None in a public one."""
    path = Path(path)
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise CurveError(f"{path}: not a readable CURVE certificate ({exc})") from exc
    if need_secret and not secret:
        raise CurveError(f"{path}: holds no secret key (give the .key_secret file)")
    return public, secret


def start_authenticator(context: zmq.Context, keys: ServerKeys) -> ThreadAuthenticator:
    """Admit CURVE clients whose public key is in `keys.authorized_dir`, in every domain."""
    authenticator = ThreadAuthenticator(context, log=logging.getLogger("edged.server.zap"))
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(keys.authorized_dir))
    count = len(list(keys.authorized_dir.glob("*.key")))
    log.info("CURVE on: %d authorized client certificate(s) in %s", count, keys.authorized_dir)
    return authenticator


def server_public_key(value: str) -> bytes:
    """The server's public key from a Z85 string or a certificate file."""
    if len(value) == KEY_LENGTH and not Path(value).exists():
        return value.encode()
    return load_certificate(value)[0]


def client_options(server_key: str, client_certificate: str | Path) -> dict[int, Any]:
    """Socket options of a CURVE client: the server's public key (Z85 or its .key file) and the client's
    own certificate (its .key_secret file)."""
    public, secret = load_certificate(client_certificate, need_secret=True)
    return {zmq.CURVE_SERVERKEY: server_public_key(server_key), zmq.CURVE_PUBLICKEY: public,
            zmq.CURVE_SECRETKEY: secret}
