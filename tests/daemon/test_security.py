"""Nobody gets in: CURVE on every tcp:// socket, through the real daemon on 127.0.0.1, and file modes
on ipc:// sockets.

Whether a client got a connection is read from ZeroMQ's own socket monitor on the client side: a
CURVE handshake either succeeds or fails with an authentication error (the ZAP authenticator's
answer), and a client that fails never gets a reply to anything it sends.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from support.daemon import Daemon
from support.doors import free_port
from zmq.utils.monitor import recv_monitor_message

from edged.client import Client, curve_options


def edged(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    """A server certificate, an authorized client `robot`, and a client `stranger` that is not."""
    d = tmp_path_factory.mktemp("keys")
    assert edged("keys", "init", str(d)).returncode == 0
    assert edged("keys", "client", str(d), "robot").returncode == 0
    import zmq.auth

    (d / "elsewhere").mkdir()
    zmq.auth.create_certificates(str(d / "elsewhere"), "stranger")  # never authorized
    return d


@pytest.fixture(scope="module")
def curve_daemon(tmp_path_factory, keys):
    tmp = tmp_path_factory.mktemp("curve")
    port, events = free_port(), free_port()
    config = (f'[daemon]\ncurve_secret_key = "{keys / "server.key_secret"}"\n'
              f'curve_authorized_dir = "{keys / "authorized"}"\n'
              f'[events]\nlisten = "tcp://127.0.0.1:{events}"\n')
    daemon = Daemon(tmp, config=config, endpoint=f"tcp://127.0.0.1:{port}")
    daemon.events_endpoint = f"tcp://127.0.0.1:{events}"
    yield daemon
    assert daemon.terminate() == 0
    daemon.close()


def handshake(socket: zmq.Socket, endpoint: str, timeout_ms: int = 5000) -> str:
    """Connect a prepared socket and report how its handshake ended: "ok", "refused" (the server's
    authenticator said no, the mechanisms differ, or the server dropped the connection before any
    handshake succeeded: when it closes first, the client may see only the reset, never the
    greeting) or "none" (nothing within the timeout)."""
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_DISCONNECTED)
    socket.connect(endpoint)
    try:
        if not monitor.poll(timeout_ms):
            return "none"
        event = recv_monitor_message(monitor)["event"]
        return "ok" if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else "refused"
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)


def curve_socket(kind: int, keys: Path, who: str | None, endpoint: str) -> zmq.Socket:
    """A client socket with the options `edged.client` gives it: the daemon's public key and `who`'s
    certificate (None: no CURVE at all)."""
    s = zmq.Context.instance().socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if who is not None:
        cert = keys / "clients" / f"{who}.key_secret" if who == "robot" else keys / "elsewhere" / f"{who}.key_secret"
        for option, value in curve_options(endpoint, str(keys / "server.key"), str(cert)).items():
            s.setsockopt(option, value)
    return s


def test_serve_refuses_tcp_without_keys_and_says_how_to_make_them(tmp_path):
    (tmp_path / "edged.toml").write_text('[audio]\ndevice = "none"\ninput_device = "none"\n')
    done = edged("serve", "--config", str(tmp_path / "edged.toml"), "--listen", f"tcp://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "refusing to listen on tcp://127.0.0.1:" in done.stderr and "without CURVE" in done.stderr
    assert "edged keys init DIR" in done.stderr and "daemon.insecure_tcp = true" in done.stderr


def test_half_configured_keys_are_refused(tmp_path, keys):
    (tmp_path / "edged.toml").write_text(f'[daemon]\ncurve_secret_key = "{keys / "server.key_secret"}"\n')
    done = edged("serve", "--config", str(tmp_path / "edged.toml"), "--listen", f"tcp://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "daemon.curve_secret_key and daemon.curve_authorized_dir go together" in done.stderr


def test_a_bad_certificate_is_a_boot_error_naming_the_file(tmp_path, keys):
    (tmp_path / "bogus.key_secret").write_text("not a certificate\n")
    (tmp_path / "edged.toml").write_text(f'[daemon]\ncurve_secret_key = "{tmp_path / "bogus.key_secret"}"\n'
                                         f'curve_authorized_dir = "{keys / "authorized"}"\n'
                                         '[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n')
    done = edged("serve", "--config", str(tmp_path / "edged.toml"), "--listen", f"tcp://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "bogus.key_secret" in done.stdout + done.stderr


@pytest.mark.parametrize("who,want", [(None, "refused"), ("stranger", "refused"), ("robot", "ok")])
def test_only_an_authorized_client_gets_a_connection(curve_daemon, keys, who, want):
    """No certificate: the plain handshake fails (the daemon speaks only CURVE); an unknown
    certificate: the authenticator refuses it; the authorized one connects. Both sockets, requests
    and events."""
    for kind, endpoint in ((zmq.DEALER, curve_daemon.endpoint), (zmq.SUB, curve_daemon.events_endpoint)):
        s = curve_socket(kind, keys, who, endpoint)
        try:
            got = handshake(s, endpoint)
        finally:
            s.close(linger=0)
        assert got == want, (kind, who)


@pytest.mark.parametrize("who", [None, "stranger"])
def test_a_client_that_is_not_authorized_gets_no_answer(curve_daemon, keys, who):
    cert = None if who is None else str(keys / "elsewhere" / f"{who}.key_secret")
    server_key = None if who is None else str(keys / "server.key")
    with Client(curve_daemon.endpoint, timeout_s=2, server_key=server_key, certificate=cert) as client, \
            pytest.raises(TimeoutError):
        client.status()


def test_an_authorized_client_is_served_with_options_and_environment(curve_daemon, keys):
    with Client(curve_daemon.endpoint, timeout_s=30, server_key=str(keys / "server.key"),
                certificate=str(keys / "clients" / "robot.key_secret")) as client:
        utterance = client.speak("Keys work.", play=False, stream=True, max_audio_ms=400)
        assert utterance.wait().reason == "length" and len(utterance.pcm) == 5 * 1920
    env = {"EDGED_SERVER_KEY": str(keys / "server.key"), "EDGED_CLIENT_CERT": str(keys / "clients" / "robot.key_secret")}
    status = edged("status", "--json", "--endpoint", curve_daemon.endpoint, "--timeout", "20", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "serving"


def test_insecure_tcp_serves_anyone_and_warns_at_boot(tmp_path):
    daemon = Daemon(tmp_path, config="[daemon]\ninsecure_tcp = true\n", endpoint=f"tcp://127.0.0.1:{free_port()}")
    try:
        with Client(daemon.endpoint, timeout_s=30) as client:
            assert client.status()["state"] == "serving"
        assert "daemon.insecure_tcp = true: tcp://127.0.0.1:" in daemon.read_log()
        assert "anyone who can reach it is served" in daemon.read_log()
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def test_ipc_socket_and_its_directory_admit_only_the_user_and_group(tmp_path):
    """Outside systemd too: the directory the daemon makes is 0750, the socket file 0660."""
    run = tmp_path / "run" / "edged"
    daemon = Daemon(tmp_path, endpoint=f"ipc://{run / 'edged.sock'}")
    try:
        assert stat.S_IMODE(run.stat().st_mode) == 0o750
        assert stat.S_IMODE((run / "edged.sock").stat().st_mode) == 0o660
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def test_client_commands_name_a_key_they_cannot_use_and_a_daemon_that_does_not_answer(tmp_path, keys):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    bad = edged("status", "--endpoint", endpoint, "--timeout", "1", "--server-key", str(keys / "server.key"),
                "--client-cert", str(tmp_path / "missing.key_secret"))
    assert bad.returncode == 1 and "missing.key_secret: not a readable CURVE certificate" in bad.stderr
    public_only = edged("status", "--endpoint", endpoint, "--timeout", "1", "--server-key", str(keys / "server.key"),
                        "--client-cert", str(keys / "server.key"))
    assert public_only.returncode == 1 and "holds no secret key" in public_only.stderr
    silent = edged("status", "--endpoint", endpoint, "--timeout", "1")
    assert silent.returncode == 1 and "edged status: status: no reply within 1 s" in silent.stderr
