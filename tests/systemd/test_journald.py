"""edged's log records arrive in a real journald with their structured fields.

How journald runs here: `unshare --mount` gives the test a private mount namespace; inside it a
tmpfs goes over /run (so nothing touches the host's /run or any running journald), a drop-in
/run/systemd/journald.conf.d/ sets Storage=volatile (entries live in /run/log/journal, in that
tmpfs) and turns kmsg/syslog/wall/console forwarding off, and Debian's systemd-journald binary is
started as a plain process. It binds /run/systemd/journal/socket, the path both senders use. A
child Python, with INVOCATION_ID set as systemd sets it, logs through `setup_logging`; then
`journalctl --directory=/run/log/journal -o json` reads the entries back. Needs root (for the
mount namespace); the other tests in this file need nothing.
"""

from __future__ import annotations

import array
import fcntl
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from edged.systemd import JournalHandler, NativeJournalSender, journal_wanted, setup_logging
from edged.systemd.logging import StderrFormatter, field_name, journal_sender

REPO = Path(__file__).resolve().parents[2]
JOURNALD = next((p for p in ("/usr/lib/systemd/systemd-journald", "/lib/systemd/systemd-journald")
                 if os.access(p, os.X_OK)), None)
MISSING = "systemd-journald/journalctl missing: run scripts/install-system-deps.sh (Debian package systemd)"

CHILD = """
import logging, sys
from edged.systemd import JournalHandler, setup_logging
handler = setup_logging("debug", journal_backend=sys.argv[1])
assert isinstance(handler, JournalHandler), handler
log = logging.getLogger("edged.test")
log.info("request finished", extra={"request_id": "r-17", "reason": "eos"})
try:
    raise RuntimeError("engine exploded")
except RuntimeError:
    log.exception("step failed", extra={"request_id": "r-18", "reason": "error"})
log.warning("big " + "x" * 1_000_000, extra={"request_id": "r-19"})  # too big for one datagram
"""

# Runs as root inside the private mount namespace; prints journalctl's JSON lines.
NAMESPACE = """
import os, subprocess, sys, time, uuid
journald, child, backend = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
os.makedirs("/run/systemd/journald.conf.d")
with open("/run/systemd/journald.conf.d/edged-test.conf", "w") as f:
    f.write("[Journal]\\nStorage=volatile\\nReadKMsg=no\\nAudit=no\\nForwardToSyslog=no\\nForwardToKMsg=no\\n"
            "ForwardToConsole=no\\nForwardToWall=no\\n")
try:
    machine_id = open("/etc/machine-id").read().strip()
except FileNotFoundError:
    machine_id = None
if machine_id is not None and len(machine_id) != 32:  # an image's empty or "uninitialized" machine-id
    with open("/run/machine-id", "w") as f:
        f.write(uuid.uuid4().hex + "\\n")
    subprocess.run(["mount", "--bind", "/run/machine-id", "/etc/machine-id"], check=True)
env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID")}
jd = subprocess.Popen([journald], env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr)
try:
    deadline = time.monotonic() + 10
    while not os.path.exists("/run/systemd/journal/socket"):
        assert jd.poll() is None and time.monotonic() < deadline, "journald did not start"
        time.sleep(0.02)
    subprocess.run([sys.executable, "-c", child, backend], env={**env, "INVOCATION_ID": uuid.uuid4().hex},
                   check=True)
    query = ["journalctl", "--directory=/run/log/journal", "-o", "json", "--all", "--no-pager",
             "SYSLOG_IDENTIFIER=edged"]
    while True:
        lines = subprocess.run(query, capture_output=True, text=True).stdout.splitlines()
        if len(lines) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print("\\n".join(lines))
finally:
    jd.terminate()
    jd.wait()
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private mount namespace")
@pytest.mark.parametrize("backend", ["systemd", "socket"])
def test_records_arrive_in_journald_with_structured_fields(backend):
    assert JOURNALD is not None and shutil.which("journalctl"), MISSING
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", NAMESPACE,
                           JOURNALD, CHILD, backend], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    entries = {e.get("REQUEST_ID"): e for e in map(json.loads, done.stdout.splitlines())}
    assert set(entries) == {"r-17", "r-18", "r-19"}, done.stdout[:2000] + done.stderr

    info = entries["r-17"]
    assert info["MESSAGE"] == "request finished" and info["REASON"] == "eos"
    assert info["PRIORITY"] == "6" and info["SYSLOG_IDENTIFIER"] == "edged" and info["LOGGER"] == "edged.test"
    assert info["THREAD_NAME"] == "MainThread" and info["CODE_FUNC"] == "<module>" and info["CODE_LINE"] == "7"
    assert info["_TRANSPORT"] == "journal"

    error = entries["r-18"]
    assert error["REASON"] == "error" and error["PRIORITY"] == "3"
    assert error["MESSAGE"].startswith("step failed\nTraceback (most recent call last):")
    assert error["MESSAGE"].endswith("RuntimeError: engine exploded")

    big = entries["r-19"]
    assert big["PRIORITY"] == "4" and big["MESSAGE"] == "big " + "x" * 1_000_000


# --------------------------------------------------------------------------------------- no journald needed


def decode_native(data: bytes) -> dict[str, str]:
    """journald's side of the native protocol."""
    fields, i = {}, 0
    while i < len(data):
        line_end = data.index(b"\n", i)
        line = data[i:line_end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = line_end + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", data[line_end + 1:line_end + 9])
            value = data[line_end + 9:line_end + 9 + size]
            assert data[line_end + 9 + size:line_end + 10 + size] == b"\n"
            i = line_end + 10 + size
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def fake_journal(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "socket"))
    sock.settimeout(5)
    yield sock, str(tmp_path / "socket")
    sock.close()


def test_native_sender_encodes_fields_and_passes_big_entries_as_a_sealed_memfd(fake_journal):
    sock, path = fake_journal
    sender = NativeJournalSender(path)
    handler = JournalHandler(sender)
    log = logging.getLogger("edged.test.native")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("two\nlines", extra={"request_id": "r1", "reason": "cancelled", "weird-key.x": 3,
                                          "color_message": "\x1b[36mtwo\x1b[0m"})  # as uvicorn adds to its own
        fields = decode_native(sock.recv(65536))
        assert "COLOR_MESSAGE" not in fields and not any("\x1b" in v for v in fields.values())
        assert fields["MESSAGE"] == "two\nlines" and fields["PRIORITY"] == "4" and fields["SYSLOG_IDENTIFIER"] == "edged"
        assert fields["REQUEST_ID"] == "r1" and fields["REASON"] == "cancelled" and fields["WEIRD_KEY_X"] == "3"
        assert fields["LOGGER"] == "edged.test.native" and fields["CODE_FUNC"].startswith("test_native_sender")

        sender.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        log.error("y" * 200_000)
        data, ancillary, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(4))
        assert data == b"" and ancillary[0][:2] == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
        fd = array.array("i", ancillary[0][2])[0]
        with os.fdopen(fd, "rb") as memfd:
            seals = fcntl.fcntl(memfd.fileno(), fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
            fields = decode_native(os.pread(memfd.fileno(), 1 << 20, 0))  # journald maps it from offset 0
        assert fields["MESSAGE"] == "y" * 200_000 and fields["PRIORITY"] == "3"
    finally:
        log.removeHandler(handler)
        handler.close()


def test_without_systemd_python_the_native_sender_is_used(monkeypatch):
    for name in ("systemd", "systemd.journal"):
        monkeypatch.setitem(sys.modules, name, None)  # `import systemd.journal` raises ImportError
    sender = journal_sender()
    assert isinstance(sender, NativeJournalSender) and sender.path == "/run/systemd/journal/socket"
    sender.close()
    with pytest.raises(ImportError, match="make install-dev"):
        journal_sender("systemd")


def test_field_names_follow_journald_rules():
    assert field_name("request_id") == "REQUEST_ID"
    assert field_name("session.id") == "SESSION_ID"
    assert field_name("_private") == "PRIVATE"  # leading _ is for journald's trusted fields
    assert field_name("3d") == "D"
    assert len(field_name("k" * 100)) == 64


def test_journal_wanted_when_stderr_is_the_journal_stream_or_a_unit_runs_us():
    read_end, write_end = os.pipe()
    try:
        st = os.fstat(write_end)
        assert journal_wanted({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stderr_fd=write_end)
        assert not journal_wanted({"JOURNAL_STREAM": "1:2"}, stderr_fd=write_end)  # stderr was redirected
        assert journal_wanted({"INVOCATION_ID": "0123456789abcdef0123456789abcdef"}, stderr_fd=write_end)
        assert not journal_wanted({}, stderr_fd=write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_outside_systemd_records_go_to_stderr_readably(monkeypatch, capsys):
    for name in ("JOURNAL_STREAM", "INVOCATION_ID"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    level = root.level
    try:
        handler = setup_logging("debug")
        assert isinstance(handler.formatter, StderrFormatter) and root.level == logging.DEBUG
        assert setup_logging("WARNING") is not handler and handler not in root.handlers  # replaced, not stacked
        handler = setup_logging("info")
        handler.stream = sys.stderr  # capsys swapped stderr after the handler was made
        logging.getLogger("edged.test").info("done", extra={"request_id": "r9", "reason": "eos",
                                                            "color_message": "\x1b[1mdone\x1b[0m"})
        line = capsys.readouterr().err.strip()
        assert line.endswith("INFO    edged.test: done [request_id=r9 reason=eos]"), line
        with pytest.raises(ValueError, match="unknown log level 'loud'"):
            setup_logging("loud")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# The real daemon inside the namespace: boot, one request, SIGTERM; its records land in journald.
DAEMON_CHILD = """
import os, signal, subprocess, sys, tempfile, time
from edged.client import Client
from edged.locate import why_not
endpoint = "ipc://" + os.path.join(tempfile.mkdtemp(), "edged.sock")
daemon = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--listen", endpoint])
deadline = time.monotonic() + 60
while why_not(endpoint[len("ipc://"):]) is not None:  # its socket appears when its boot is done
    assert daemon.poll() is None and time.monotonic() < deadline, "the daemon did not come up"
    time.sleep(0.05)
with Client(endpoint, timeout_s=60) as client:
    done = client.speak("Logged to the journal.", id="j-1", play=False, max_audio_ms=240).wait()
    assert done.reason == "length", done
daemon.send_signal(signal.SIGTERM)
assert daemon.wait(timeout=30) == 0
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private mount namespace")
def test_the_daemon_logs_structured_records_to_journald():
    assert JOURNALD is not None and shutil.which("journalctl"), MISSING
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", NAMESPACE,
                           JOURNALD, DAEMON_CHILD, "auto"], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    messages = [e["MESSAGE"] for e in entries]
    assert any(m.startswith("claimed kv_cache") for m in messages), messages
    assert any(m.startswith("serving qwen3_tts on ipc://") for m in messages), messages
    finished = [e for e in entries if e.get("REQUEST_ID") == "j-1"]
    assert finished and finished[0]["REASON"] == "length" and finished[0]["LOGGER"] == "edged.loop"
    assert "stopped" in messages
