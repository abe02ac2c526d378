"""The history's disk fails, the daemon keeps speaking: a corrupt file at boot (moved aside, or
refused), an unwritable path, and the disk full mid-run (a real tmpfs in a private mount
namespace, filled from outside through /proc/PID/root). Nothing is silently dropped: the client a
failed write concerns gets an `error` naming it, and `status` and the log say what is wrong."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from support.daemon import Daemon

from edged.client import Client, ProtocolError

GARBAGE = b"this is not an SQLite database, whatever its name says\n" * 64


def serve_plain(client: Client) -> None:
    """Speech without a session still works."""
    assert client.speak("Still speaking.", play=False, stream=True, max_audio_ms=400).wait().reason == "length"


def test_a_corrupt_file_is_moved_aside_untouched_and_a_fresh_history_starts(tmp_path):
    path = tmp_path / "history.sqlite3"
    path.write_bytes(GARBAGE)
    daemon = Daemon(tmp_path, config=f'[history]\npath = "{path}"\n')
    try:
        moved = [p for p in tmp_path.iterdir() if p.name.startswith("history.sqlite3.corrupt-")]
        assert len(moved) == 1 and moved[0].read_bytes() == GARBAGE
        assert "moved aside as history.sqlite3.corrupt-" in daemon.read_log()
        with Client(daemon.endpoint, timeout_s=30) as client:
            client.turn("s", "user", "Hello?")
            assert client.history("s") == [{"role": "user", "content": "Hello?"}]
            assert client.status()["history"]["state"] == "ok"
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def test_a_corrupt_file_with_refuse_is_kept_and_the_daemon_speaks_without_history(tmp_path):
    path = tmp_path / "history.sqlite3"
    path.write_bytes(GARBAGE)
    daemon = Daemon(tmp_path, config=f'[history]\npath = "{path}"\non_corrupt = "refuse"\n')
    try:
        with Client(daemon.endpoint, timeout_s=30) as client:
            history = client.status()["history"]
            assert history["state"] == "unavailable" and "not a database" in history["error"]
            assert history["error"].count(str(path)) == 1, history["error"]  # the file named once
            with pytest.raises(ProtocolError, match=r"speak: history unavailable \(.*not a database.*\): speak "
                                                    r"without a session"):
                client.speak("With a session.", session="s", play=False).wait()
            serve_plain(client)
        shown = subprocess.run([sys.executable, "-m", "edged", "status", "--endpoint", daemon.endpoint],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"^history +unavailable \(.*not a database.*\)$", shown.stdout, re.M), shown.stdout
        assert path.read_bytes() == GARBAGE and "history unavailable, serving without it" in daemon.read_log()
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def test_an_unwritable_history_path_leaves_the_daemon_speaking(tmp_path):
    (tmp_path / "a-file").write_text("a file where a directory should be")
    daemon = Daemon(tmp_path, config=f'[history]\npath = "{tmp_path / "a-file" / "history.sqlite3"}"\n')
    try:
        with Client(daemon.endpoint, timeout_s=30) as client:
            assert client.status()["history"]["state"] == "unavailable"
            serve_plain(client)
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def fill(path) -> None:
    """Write zeros into `path` until its filesystem is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private mount namespace")
def test_the_disk_full_mid_run_is_reported_to_the_client_and_the_daemon_goes_on(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    mount = 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
    daemon = Daemon(tmp_path, state=state,
                    wrap=("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, str(state)))
    try:
        inside = f"/proc/{daemon.proc.pid}/root{state}"
        assert daemon.proc.poll() is None and os.path.isdir(f"{inside}/edged")
        with Client(daemon.endpoint, timeout_s=30) as client:
            client.turn("s", "user", "Saved before the disk filled.")
            assert client.history("s")[0]["content"] == "Saved before the disk filled."
            fill(f"{inside}/fill")
            client.turn("big", "user", "x" * 300_000)  # needs new pages: the disk has none
            with pytest.raises(ProtocolError, match=r"history: the user turn of session 'big' was not saved "
                                                    r"\(database or disk is full\)"):
                client.history("big")  # the error names no id: it comes before this answer, which raises it
            history = degraded(client)
            assert history["errors"] == 1 and "disk is full" in history["last_error"]
            serve_plain(client)
            os.remove(f"{inside}/fill")
            client.turn("s", "user", "Saved again.")
            assert [t["content"] for t in client.history("s")] == ["Saved before the disk filled.", "Saved again."]
        assert "history: the user turn of session 'big' was not saved" in daemon.read_log()
    finally:
        assert daemon.terminate() == 0
        daemon.close()


def degraded(client: Client, timeout: float = 10) -> dict:
    """The history's status once it counts the refusal (the thread counts after it replies)."""
    deadline = time.monotonic() + timeout
    while (history := client.status()["history"])["state"] != "degraded":
        assert time.monotonic() < deadline, history
        time.sleep(0.05)
    return history
