"""The front doors refuse to start on bad options, with a message naming what was wrong (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def edged(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,wanted", [
    (("http", "--listen", "8880"), "edged http: --listen takes HOST:PORT, not '8880'"),
    (("http", "--api-key-file", "/nonexistent/key"), "edged http: --api-key-file /nonexistent/key: No such file or directory"),
    (("wyoming", "--uri", "unix:///tmp/x.sock", "--zeroconf"), "edged wyoming: --zeroconf needs a tcp:// --uri, not unix:///tmp/x.sock"),
    (("wyoming", "--endpoint", "tcp://127.0.0.1:5555", "--server-key", "/nonexistent/server.key"),
     "edged wyoming: CURVE needs both the daemon's public key"),
])
def test_bad_options_are_refused_naming_them(args, wanted):
    done = edged(*args)
    assert done.returncode == 2 and done.stderr.startswith(wanted), done.stderr


def test_an_empty_key_file_is_refused(tmp_path):
    (tmp_path / "key").write_text("\n")
    done = edged("http", "--api-key-file", str(tmp_path / "key"))
    assert done.returncode == 2 and done.stderr == f"edged http: --api-key-file {tmp_path / 'key'} is empty\n"


def test_zeroconf_without_a_uri_listens_where_the_network_reaches_it():
    """An advertised service must be reachable: --zeroconf alone listens on every interface; without
    --zeroconf (and whenever --uri is given) the door listens where it is told."""
    from edged.cli.doors import wyoming_uri

    assert wyoming_uri(None, "edged") == "tcp://0.0.0.0:10200"
    assert wyoming_uri(None, None) == "tcp://127.0.0.1:10200"
    assert wyoming_uri("tcp://192.0.2.7:10300", "edged") == "tcp://192.0.2.7:10300"
