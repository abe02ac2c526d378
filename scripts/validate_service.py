"""How scripts/validate_jetson.py runs the daemon for its soak: as the installed `edged.service` (on a
device: its user and groups, ProtectSystem=strict, CUDA_CACHE_PATH, the 10 s watchdog; `sudo make
install-system` first), or directly as `python -m edged serve` (the dry run on ONNX Runtime).

The service is pointed at the artifact under test by a runtime drop-in (/run/systemd/system/
edged.service.d/50-validate.conf, gone at the next reboot and removed at the end) that replaces
ExecStart with the installed `edged serve --config FILE --listen tcp://127.0.0.1:PORT` (an endpoint
the validating user reaches without joining group edged); the artifact and FILE are copied where
user edged reads them (/var/lib/edged/artifacts/validate). At the end the drop-in and the copy are
removed and the unit is restarted as it was (or left stopped if it was)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DROPIN = Path("/run/systemd/system/edged.service.d/50-validate.conf")
PLACE = Path("/var/lib/edged/artifacts/validate")


def config(backend: str, artifact: Path, tcp: bool) -> str:
    """The daemon's config for the soak: greedy, no audio devices, no event socket."""
    return (f'[daemon]\nbackend = "{backend}"\nartifact = "{artifact}"\n' + ("insecure_tcp = true\n" if tcp else "") +
            '[audio]\ndevice = "none"\ninput_device = "none"\n[events]\nlisten = "none"\n'
            '[sampling]\ntemperature = 0.0\ncp_temperature = 0.0\n')


def dropin(exec_start: str, config_file: Path, endpoint: str) -> str:
    """The drop-in that points the installed unit at the soak's config and endpoint."""
    return f"[Service]\nExecStart=\nExecStart={exec_start} serve --config {config_file} --listen {endpoint}\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Direct:
    """`python -m edged serve` in a directory of its own."""

    def __init__(self, artifact: Path, backend: str):
        self.tmp = Path(tempfile.mkdtemp(prefix="edged-validate-"))
        self.endpoint = f"ipc://{self.tmp / 'edged.sock'}"
        (self.tmp / "edged.toml").write_text(config(backend, artifact, tcp=False))
        self.out = open(self.tmp / "daemon.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(self.tmp / "edged.toml"),
                                      "--listen", self.endpoint], stdout=self.out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "XDG_STATE_HOME": str(self.tmp)})
        self.what = "python -m edged serve"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        self.out.flush()
        return (self.tmp / "daemon.log").read_text()

    def terminate(self) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(15)
        return self.proc.wait(timeout=60)

    def problems(self) -> list[str]:
        return []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.out.close()


class Service:
    """The installed edged.service, restarted on the artifact under test."""

    def __init__(self, artifact: Path, backend: str):
        unit = subprocess.run(["systemctl", "cat", "edged.service"], capture_output=True, text=True)
        exec_start = re.search(r"^ExecStart=(\S+) serve", unit.stdout, re.M)
        if unit.returncode or exec_start is None:
            raise RuntimeError("edged.service is not installed: run `sudo make install-system` first (docs/daemon.md)")
        self.was_active = _systemctl("is-active", "--quiet", "edged", check=False).returncode == 0
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.what = "edged.service"
        _sudo("rm", "-rf", str(PLACE))
        _sudo("mkdir", "-p", str(PLACE))
        _sudo("cp", "-r", str(artifact), str(PLACE / "artifact"))
        staged = Path(tempfile.mkdtemp(prefix="edged-validate-"))
        (staged / "edged.toml").write_text(config(backend, PLACE / "artifact", tcp=True))
        (staged / "dropin.conf").write_text(dropin(exec_start.group(1), PLACE / "edged.toml", self.endpoint))
        _sudo("cp", str(staged / "edged.toml"), str(PLACE / "edged.toml"))
        _sudo("chown", "-R", "edged:edged", str(PLACE))
        _sudo("mkdir", "-p", str(DROPIN.parent))
        _sudo("cp", str(staged / "dropin.conf"), str(DROPIN))
        shutil.rmtree(staged)
        self.since = time.time()
        self.restarts = self._show("NRestarts")
        _systemctl("daemon-reload")
        _systemctl("restart", "edged", check=False)  # Type=notify: returns at READY=1, or the start failed

    def _show(self, prop: str) -> str:
        return subprocess.run(["systemctl", "show", "edged", "-p", prop, "--value"], capture_output=True,
                              text=True).stdout.strip()

    def alive(self) -> bool:
        return self._show("ActiveState") == "active"

    def log(self) -> str:
        return subprocess.run(["sudo", "journalctl", "-u", "edged", "--since", f"@{int(self.since)}", "-o", "cat",
                               "--no-pager"], capture_output=True, text=True).stdout

    def terminate(self) -> int:
        """`systemctl stop` (SIGTERM, the drain); the main process's exit status."""
        _systemctl("stop", "edged", check=False)
        return int(self._show("ExecMainStatus") or -1)

    def problems(self) -> list[str]:
        """What the unit's own checks saw: restarts (a watchdog timeout, a crash) during the soak."""
        found = []
        if self._show("NRestarts") != self.restarts:
            found.append(f"restarted {self._show('NRestarts')} times (was {self.restarts})")
        if "Watchdog timeout" in self.log():
            found.append("a watchdog timeout")
        return found

    def close(self) -> None:
        _sudo("rm", "-f", str(DROPIN))
        _systemctl("daemon-reload")
        _sudo("rm", "-rf", str(PLACE))
        if self.was_active:
            _systemctl("restart", "edged", check=False)


def _sudo(*argv: str) -> None:
    subprocess.run(["sudo", *argv], check=True)


def _systemctl(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["sudo", "systemctl", *argv], check=check, capture_output=True, text=True)
