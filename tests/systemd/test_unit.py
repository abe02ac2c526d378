"""The shipped unit file: systemd accepts it without a single complaint, and it says what edged needs.

`systemd-analyze verify` checks every directive, but also that ExecStart's binary exists; edged is
not installed at /opt/edged on a test machine. So:
- as root, the shipped file itself is verified inside `unshare --mount`, where a tmpfs over /opt
  holds an `edged` shim at /opt/edged/bin/edged (the host's /opt is untouched);
- anywhere, a copy whose ExecStart points at a shim in a temporary directory is verified.
The installed units, with the real binary, are verified by tests/systemd/test_install.py.
verify exits 0 even for unknown keys or bad values (it only warns), so both tests demand an
empty stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edged.config import Config

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "edged.service"
MISSING = "systemd-analyze missing: run scripts/install-system-deps.sh (Debian package systemd)"


def directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values, in order (unit files repeat keys)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


DOORS = [SYSTEMD / "edged-wyoming.service", SYSTEMD / "edged-http.service"]


def exec_start(unit: Path = UNIT) -> str:
    return directives(unit)["Service"]["ExecStart"][0].split()[0]


def test_unit_says_what_edged_needs():
    unit = directives(UNIT)
    service = {k: v[-1] for k, v in unit["Service"].items()}
    expected = {
        "Type": "notify", "NotifyAccess": "main", "WatchdogSec": "10s", "Restart": "on-failure",
        "User": "edged", "Group": "edged", "SupplementaryGroups": "audio video",
        "RuntimeDirectory": "edged", "StateDirectory": "edged", "ConfigurationDirectory": "edged",
        "LimitMEMLOCK": "infinity", "LimitRTPRIO": "10", "LimitNICE": "-10",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "NoNewPrivileges": "yes", "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "ExecStart": "/opt/edged/bin/edged serve",
    }
    assert {k: service.get(k) for k in expected} == expected
    # the audio threads' SCHED_FIFO (audio.realtime_priority's default, 5) is within LimitRTPRIO, and
    # nothing takes real time away from the service
    assert int(service["LimitRTPRIO"]) >= Config().audio.realtime_priority and "RestrictRealtime" not in service
    # No --config: `edged serve` reads $CONFIGURATION_DIRECTORY/edged.toml when there is one, and the
    # defaults otherwise, so a missing file cannot keep the daemon down (five exits 2, then none).
    assert "--config" not in service["ExecStart"]
    # The GPU and sound nodes stay reachable: no private /dev, no device allow-list, and no ProtectClock=
    # (older systemd turns it into DeviceAllow=char-rtc, which switches the allow-list on).
    assert not {"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"} & set(service)
    # The stop timeout covers the default drain deadline (daemon.drain_timeout_s = 10 s) plus teardown.
    assert service["TimeoutStopSec"].endswith("s") and float(service["TimeoutStopSec"][:-1]) >= 20
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.parametrize("unit,command", [(DOORS[0], "wyoming --uri tcp://0.0.0.0:10200 --zeroconf"),
                                          (DOORS[1], "http --listen 127.0.0.1:8880")], ids=["wyoming", "http"])
def test_front_door_units_follow_the_daemon_with_its_sandbox(unit, command):
    """After edged.service, as its user (whose group reaches the socket), with every sandbox directive
    of the daemon's unit and no devices."""
    door, daemon = directives(unit), directives(UNIT)
    assert "edged.service" in door["Unit"]["After"][0].split() and "edged.service" in door["Unit"]["Wants"][0].split()
    service = {k: v[-1] for k, v in door["Service"].items()}
    assert service["ExecStart"] == f"/opt/edged/bin/edged {command} --endpoint ipc:///run/edged/edged.sock"
    assert (service["User"], service["Group"], service["PrivateDevices"]) == ("edged", "edged", "yes")
    sandbox = ("ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges", "CapabilityBoundingSet",
               "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
               "ProtectHostname", "ProtectProc", "RestrictAddressFamilies", "RestrictNamespaces", "RestrictSUIDSGID",
               "LockPersonality", "SystemCallArchitectures", "SystemCallFilter")
    assert {k: service.get(k) for k in sandbox} == {k: daemon["Service"][k][-1] for k in sandbox}
    assert door["Install"]["WantedBy"] == ["multi-user.target"]


def verify(unit_path: Path, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, "systemd-analyze", "verify", str(unit_path)], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private mount namespace")
def test_shipped_unit_verifies_cleanly():
    assert shutil.which("systemd-analyze"), MISSING
    binary = exec_start()
    assert binary == "/opt/edged/bin/edged"  # the tmpfs below hides the rest of /opt: nothing needs it
    shim = f"mount -t tmpfs -o mode=0755 tmpfs /opt && mkdir -p {os.path.dirname(binary)} && " \
           f"printf '#!/bin/sh\\n' > {binary} && chmod 0755 {binary} && exec \"$0\" \"$@\""
    done = verify(UNIT, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", shim)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("unit", [UNIT, *DOORS], ids=lambda p: p.name)
def test_unit_verifies_cleanly_with_exec_start_on_a_shim(tmp_path, unit):
    assert shutil.which("systemd-analyze"), MISSING
    shim = tmp_path / "edged"
    shim.write_text("#!/bin/sh\n")
    shim.chmod(0o755)
    copy = tmp_path / unit.name  # the same name: verify derives the unit's name from the file's
    copy.write_text(unit.read_text().replace(f"ExecStart={exec_start(unit)} ", f"ExecStart={shim} "))
    assert str(shim) in copy.read_text()
    done = verify(copy)
    assert (done.returncode, done.stderr) == (0, "")


def test_sysusers_snippet_creates_the_edged_user(tmp_path):
    if shutil.which("systemd-sysusers") is None:
        pytest.fail(MISSING.replace("systemd-analyze", "systemd-sysusers"))
    (tmp_path / "etc").mkdir()
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD / "edged.sysusers.conf")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert all(line.startswith("Creating ") for line in done.stderr.splitlines()), done.stderr  # no warnings
    user = next(line for line in (tmp_path / "etc/passwd").read_text().splitlines() if line.startswith("edged:"))
    assert user.split(":")[4:] == ["edged speech daemon", "/var/lib/edged", "/usr/sbin/nologin"]
    assert any(line.startswith("edged:") for line in (tmp_path / "etc/group").read_text().splitlines())
