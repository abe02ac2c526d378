"""sd_notify from edged.systemd, received the way systemd receives it: a datagram socket named by
NOTIFY_SOCKET, bound by the test, and a real child process sending to it.

Subprocess tests run with systemd-python (backend "systemd") and with the pure-Python sender
(backend "socket"); the lifecycle test also on a path socket and on an abstract one ("@name").
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from edged.systemd import BootProgress, Notifier, Watchdog, watchdog_interval

REPO = Path(__file__).resolve().parents[2]


class Receiver:
    """Plays systemd: binds NOTIFY_SOCKET and records (arrival time, message) from a thread."""

    def __init__(self, abstract: bool):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dir = tempfile.mkdtemp(prefix="edged-notify-")
        if abstract:
            name = f"edged-test-{os.getpid()}-{id(self)}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.address = os.path.join(self.dir, "notify")
            self.sock.bind(self.address)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def texts(self) -> list[str]:
        return [text for _, text in self.messages]

    def when(self, text: str) -> float:
        return next(t for t, m in self.messages if m == text)


@pytest.fixture(params=["path", "abstract"])
def receiver(request):
    r = Receiver(abstract=request.param == "abstract")
    yield r
    r.close()


def run_child(code: str, receiver: Receiver, *args: str, **env: str) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    environ.update(NOTIFY_SOCKET=receiver.address, **env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code, *args], env=environ, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    time.sleep(0.1)  # the receiver thread drains the socket


LIFECYCLE = """
import sys
from edged.systemd import Notifier
n = Notifier(sys.argv[1])
assert n.enabled and n.backend == sys.argv[1], n.backend
assert n.ready() and n.status("serving on ipc://x: 0/4 members,\\n0 queued") and n.watchdog() and n.stopping()
"""


@pytest.mark.parametrize("backend", ["systemd", "socket"])
def test_lifecycle_messages_arrive_in_order(receiver, backend):
    run_child(LIFECYCLE, receiver, backend)
    assert receiver.texts() == ["READY=1", "STATUS=serving on ipc://x: 0/4 members, 0 queued", "WATCHDOG=1",
                                "STOPPING=1"]


WATCHDOG_STALL = """
import sys, time
from edged.systemd import Notifier, Watchdog
n = Notifier(sys.argv[1])
wd = Watchdog(n, stall_after_s=0.15)  # interval from WATCHDOG_USEC: pings every 0.1 s

def loop(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        wd.progress()
        time.sleep(0.01)

assert wd.interval_s == 0.2 and wd.ping_every_s == 0.1 and wd.enabled
n.ready()
wd.start()
n.status("progress"); loop(0.6)
n.status("stall"); time.sleep(1.2)
n.status("resume"); loop(0.6)
wd.stop()
n.stopping()
"""


@pytest.mark.parametrize("receiver", ["path"], indirect=True)
@pytest.mark.parametrize("backend", ["systemd", "socket"])
def test_watchdog_pings_stop_while_the_loop_stalls_and_resume_after(receiver, backend):
    """1. The loop progresses: WATCHDOG=1 at most every ping_every_s (0.1 s).
    2. The loop stalls for 1.2 s: pings stop once progress is older than stall_after_s (0.15 s).
    3. The loop resumes: pings resume.

    The bounds hold on a loaded machine: a late thread sends fewer pings, never more (it waits at
    least ping_every_s between them; the receiver's clock only says which phase a ping fell in), and
    the last ping of a stall is at most stall_after_s plus one ping period after the last progress,
    or 0.6 s more where the machine is slow. The pinger's decision itself is tested on a fake clock
    below."""
    run_child(WATCHDOG_STALL, receiver, backend, WATCHDOG_USEC="200000")
    texts = receiver.texts()
    assert texts[0] == "READY=1" and texts[-1] == "STOPPING=1", texts
    progress, stall, resume = (receiver.when(f"STATUS={s}") for s in ("progress", "stall", "resume"))
    pings = [t for t, m in receiver.messages if m == "WATCHDOG=1"]

    during_progress = [t for t in pings if progress <= t < stall]
    assert 2 <= len(during_progress) <= 10, pings  # 6 or 7 in the 0.6 s loop; 10 allows it to overrun by 0.3 s

    late_in_stall = [t - stall for t in pings if stall + 0.15 + 0.1 + 0.6 <= t < resume]
    assert late_in_stall == [], late_in_stall  # 9 expected without stall detection
    assert resume - stall > 1.1

    after_resume = [t for t in pings if t >= resume]
    assert len(after_resume) >= 2, pings


def test_watchdog_interval_follows_sd_watchdog_enabled():
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "10000000"}) == 10.0
    assert watchdog_interval({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}) == 10.0
    assert watchdog_interval({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    for bad in ({"WATCHDOG_USEC": "ten"}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "5", "WATCHDOG_PID": "x"}):
        with pytest.raises(ValueError, match="WATCHDOG_"):
            watchdog_interval(bad)


def test_watchdog_tick_pings_only_while_progress_is_fresh(receiver, monkeypatch):
    """The pinger's decision with a fake clock, no thread."""
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.address)
    now = [100.0]
    wd = Watchdog(Notifier("socket"), 10.0, stall_after_s=3.0, clock=lambda: now[0])
    assert wd.ping_every_s == 5.0
    wd.progress()
    now[0] = 102.9
    assert wd.tick() and not wd.stalled
    now[0] = 103.1  # progress is 3.1 s old
    assert not wd.tick() and wd.stalled
    now[0] = 110.0
    assert not wd.tick()
    wd.progress()
    assert wd.tick() and not wd.stalled
    time.sleep(0.1)
    assert receiver.texts() == ["WATCHDOG=1", "WATCHDOG=1"]


def test_outside_systemd_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    for backend in ("auto", "socket"):
        n = Notifier(backend)  # type: ignore[arg-type]
        assert not n.enabled
        assert not any([n.ready(), n.status("x"), n.watchdog(), n.stopping(), n.reloading(), n.extend_timeout(5)])
        wd = Watchdog(n).start()
        assert not wd.enabled and wd._thread is None
        wd.progress()
        wd.stop()


def test_auto_is_the_socket_sender_and_systemd_needs_systemd_python(monkeypatch, receiver):
    for name in ("systemd", "systemd.daemon"):
        monkeypatch.setitem(sys.modules, name, None)  # `import systemd.daemon` raises ImportError
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.address)
    assert Notifier().backend == "socket"
    with pytest.raises(ImportError, match="make install-dev"):
        Notifier("systemd")
    assert Notifier().ready()
    time.sleep(0.1)
    assert receiver.texts() == ["READY=1"]


@pytest.mark.parametrize("backend", ["systemd", "socket"])
def test_a_failed_send_is_logged_once_and_returns_false(monkeypatch, caplog, tmp_path, backend):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    n = Notifier(backend)
    with caplog.at_level("INFO", logger="edged.systemd"):
        assert not n.ready() and not n.watchdog() and not n.watchdog()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "sd_notify" in warnings[0].getMessage() and "READY=1" in warnings[0].getMessage()


def test_a_full_notify_socket_never_blocks_the_sender(monkeypatch, tmp_path, caplog):
    """A manager that stops reading (a full datagram queue) costs messages, never the daemon's time."""
    path = str(tmp_path / "full.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)  # never read
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    n = Notifier()
    t0 = time.monotonic()
    sent = [n.status(f"line {i}") for i in range(2000)]
    assert time.monotonic() - t0 < 5
    assert sent[0] and not all(sent)
    assert sum("sd_notify" in r.message and "failed" in r.message for r in caplog.records) == 1
    sink.close()


def test_boot_progress_extends_the_start_timeout_while_the_boot_moves(receiver, monkeypatch):
    """A stage asks at once; steps ask at most every `every_s`; after done() nothing more is asked."""
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.address)
    boot = BootProgress(Notifier("socket"), extend_s=60.0, every_s=0.3)
    boot.stage("loading the engines")
    for _ in range(50):  # a burst of plans bound: within every_s, no more messages
        boot.step()
    time.sleep(0.35)
    boot.step()
    boot.done()
    time.sleep(0.35)
    boot.step()
    boot.stage("after the boot")  # STATUS still goes out; no extension
    time.sleep(0.1)
    assert receiver.texts() == ["STATUS=booting: loading the engines", "EXTEND_TIMEOUT_USEC=60000000",
                                "EXTEND_TIMEOUT_USEC=60000000", "STATUS=booting: after the boot"]
    assert boot.sent == 2
