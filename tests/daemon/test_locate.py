"""Clients find the daemon without --endpoint: this user's socket first, then the system daemon's
/run/edged/edged.sock; with neither listening they say so at once, naming what they tried.

The system socket is reached for real: the daemon runs in a private mount namespace with a tmpfs over
/run (the host's /run is untouched), and the client command joins that namespace with nsenter.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edged.locate import NoDaemon, daemon_endpoint

ROOT_AND_UNSHARE = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                      reason="needs root and unshare(1) for a private /run")


def user_env(runtime: Path) -> dict[str, str]:
    """A client's environment whose own runtime directory is `runtime` (no systemd directories)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNTIME_DIRECTORY", "NOTIFY_SOCKET")}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


def edged(*args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    # 30 s: a client that waited out its default 60 s --timeout fails here
    return subprocess.run([*prefix, sys.executable, "-m", "edged", *args], capture_output=True, text=True, env=env,
                          timeout=30)


def test_with_no_daemon_a_client_says_what_it_tried_at_once(tmp_path):
    done = edged("status", env=user_env(tmp_path))
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip()
    assert line.startswith("edged status: no daemon found (") and "\n" not in line, done.stderr
    assert f"ipc://{tmp_path}/edged/edged.sock: no such socket" in line
    assert "ipc:///run/edged/edged.sock: " in line and "edged serve" in line


def test_status_wait_answers_once_a_daemon_started_after_it_is_ready_and_gives_up_naming_what_it_tried(tmp_path):
    """`edged status --wait S`, as the README's recipes run it after `edged serve &`."""
    env = {**user_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}  # its history in the test's directory
    waiting = subprocess.Popen([sys.executable, "-m", "edged", "status", "--wait", "120", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--audio-device", "none", "--input-device",
                               "none"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out, err = waiting.communicate(timeout=150)
        assert waiting.returncode == 0, err
        assert json.loads(out)["state"] == "serving"
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    t0 = time.monotonic()
    done = edged("status", "--wait", "1.5", env=env)
    assert done.returncode == 1 and time.monotonic() - t0 >= 1.5
    assert done.stderr.startswith("edged status: no daemon found (") and f"ipc://{tmp_path}/edged/edged.sock" in done.stderr


def test_a_socket_nobody_listens_on_is_named_as_such(tmp_path, monkeypatch):
    """A daemon killed with -9 leaves its socket file: connecting is refused, said at once."""
    (tmp_path / "edged").mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "edged" / "edged.sock"))  # bound, never listening: connect() is refused
    stale.close()
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(NoDaemon, match=f"ipc://{tmp_path}/edged/edged.sock: nothing listens on it"):
        daemon_endpoint()
    done = edged("say", "hi", "--endpoint", f"ipc://{tmp_path}/edged/edged.sock", env=user_env(tmp_path))
    assert done.returncode == 1 and "nothing listens on it" in done.stderr, done.stderr


def test_this_users_daemon_comes_first(start_daemon, tmp_path, monkeypatch):
    """The command and the library alike (`Client()` with no endpoint)."""
    from edged.client import Client

    runtime = tmp_path / "runtime"
    (runtime / "edged").mkdir(parents=True)
    start_daemon(endpoint=f"ipc://{runtime}/edged/edged.sock")
    done = edged("status", "--json", env=user_env(runtime))
    assert done.returncode == 0, done.stderr
    assert '"state": "serving"' in done.stdout
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with Client(timeout_s=30) as client:
        assert client.endpoint == f"ipc://{runtime}/edged/edged.sock" and client.status()["state"] == "serving"


@ROOT_AND_UNSHARE
def test_the_system_daemon_is_found_at_run_edged(start_daemon, tmp_path):
    private_run = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 0750 /run/edged && exec "$0" "$@"')
    daemon = start_daemon(endpoint="ipc:///run/edged/edged.sock", wrap=private_run)
    inside = ("nsenter", f"--mount=/proc/{daemon.proc.pid}/ns/mnt", "--")
    done = edged("status", "--json", env=user_env(tmp_path), prefix=inside)  # nothing at the user's own socket
    assert done.returncode == 0, done.stderr
    assert '"state": "serving"' in done.stdout
    assert not Path("/run/edged/edged.sock").exists()  # the host's /run was never touched
