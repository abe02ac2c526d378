"""`sudo make install-system`, for real: scripts/install-system.sh runs as root in a private mount
namespace where /etc is a private copy and /opt, /var, /usr/local and /run are overlays whose writes land
in a tmpfs of that namespace, so the user, units, virtual environment and config it writes are the
namespace's alone (the host is compared before and after). pip uses the package index and pip's cache;
one install serves the module.

systemd is not PID 1 here, so the installed unit is run as systemd would run it: its ExecStart, read
from the installed file, as its User= with its groups, directories, environment and UMask=, under a
NOTIFY_SOCKET the test binds. What only systemd does (the sandbox, restarts) is not shown here; the
unit file's own checks are tests/systemd/test_unit.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from support.daemon import NotifySocket

from edged.locate import GROUP_HINT

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-system.sh"
UNITS = ["edged.service", "edged-wyoming.service", "edged-http.service"]
OVERLAID = ["/opt", "/var", "/usr/local", "/run"]
"""Besides /etc (a copy): what the script and the daemon write to, seen by the namespace only."""
HOST_PATHS = ["/opt/edged", "/etc/edged", "/var/home-cook", "/etc/sysusers.d/edged.conf",
              *(f"/etc/systemd/system/{u}" for u in UNITS),
              "/run/edged", "/var/lib/edged", "/var/cache/edged", "/usr/local/bin/edged", "/usr/local/bin/edged-engines",
              "/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow"]
TOOLS = ("unshare", "nsenter", "setpriv", "useradd", "systemd-sysusers", "systemd-analyze", "dpkg-query")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
                             reason=f"needs root and {', '.join(TOOLS)}: the install runs in a private mount namespace")
SPECIFIERS = {"%C": "/var/cache", "%S": "/var/lib", "%t": "/run", "%E": "/etc"}
"""systemd's specifiers for a system unit's directories (systemd.unit(5))."""


class Namespace:
    """A private mount namespace, held open by a sleeping process; commands join it with nsenter."""

    def __init__(self, scratch: Path):
        steps = [f"mount -t tmpfs -o mode=0700 tmpfs {scratch}", f"cp -a /etc {scratch}/etc",
                 f"mount --bind {scratch}/etc /etc"]
        for path in OVERLAID:
            layer = scratch / path.strip("/").replace("/", "-")
            steps += [f"mkdir -p {layer}/upper {layer}/work",
                      f"mount -t overlay overlay -o lowerdir={path},upperdir={layer}/upper,workdir={layer}/work {path}"]
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                                      " && ".join(steps) + " && echo ready && exec sleep infinity"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n", "the namespace's mounts failed"
        self.root = Path(f"/proc/{self.proc.pid}/root")
        """Its files, from outside it."""

    def command(self, *argv: str) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "--", *argv]

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60,
            umask: int = -1) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*argv), capture_output=True, text=True, env=env, timeout=timeout, umask=umask,
                              check=False)

    def ids(self, user: str) -> tuple[int, int]:
        """uid and gid of a user of the namespace's /etc/passwd."""
        for line in (self.root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
        raise KeyError(user)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def snapshot(paths: list[str]) -> dict[str, object]:
    """What each path is on the host: absent, a link's target, a file's hash or a directory's names."""
    seen: dict[str, object] = {}
    for name in paths:
        path = Path(name)
        if path.is_symlink():
            seen[name] = ("link", os.readlink(path))
        elif path.is_file():
            seen[name] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        elif path.is_dir():
            seen[name] = ("dir", sorted(os.listdir(path)))
        else:
            seen[name] = None
    return seen


def install_env(**extra: str) -> dict[str, str]:
    """sudo's environment, more or less: the caller's, without a venv or a Python path of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PREFIX", "BINDIR", "PYTHON", "CUDA_HOME")}
    return env | {"DOORS": "1", "START": "0", "JETSON": "0"} | extra


class Installed:
    def __init__(self, ns: Namespace, output: str, seconds: float, host: dict[str, object]):
        self.ns, self.output, self.seconds = ns, output, seconds
        self.host = host
        """The host's HOST_PATHS before the install."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    text = SCRIPT.read_text()
    packages = re.search(r"^packages=\((.*)\)$", text, re.M)[1].split()  # type: ignore[index]
    missing = [p for p in packages if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                                     text=True).stdout != "install ok installed"]
    if missing:  # the script would install them, and on the host: /usr is not the namespace's own
        pytest.fail(f"missing Debian packages {missing}: run scripts/install-system-deps.sh first")
    before = snapshot(HOST_PATHS)
    ns = Namespace(tmp_path_factory.mktemp("install-namespace"))
    try:
        t0 = time.monotonic()
        # umask 077, as some admins' sudo has it: the venv and config must still be readable by user edged
        done = ns.run("bash", str(SCRIPT), env=install_env(), timeout=900, umask=0o077)
        assert done.returncode == 0, done.stdout + done.stderr
        yield Installed(ns, done.stdout, time.monotonic() - t0, before)
    finally:
        ns.close()


def directives(text: str) -> dict[str, list[str]]:
    """The [Service] section's key -> values, in order."""
    service: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif line and not line.startswith(("#", ";")) and section == "[Service]":
            key, _, value = line.partition("=")
            service.setdefault(key, []).append(value)
    return service


def expand(value: str) -> str:
    for specifier, path in SPECIFIERS.items():
        value = value.replace(specifier, path)
    assert "%" not in value, f"a specifier this test does not know: {value}"
    return value


@AS_ROOT
def test_the_install_writes_what_docs_daemon_md_says(installed):
    """The units (ExecStart at /opt/edged/bin/edged, which exists), the sysusers snippet and user
    edged, the commented config, the artifacts' directory, the links in /usr/local/bin, a venv that
    holds edged itself (not a link to this checkout) with the systemd and doors extras and the VAD's
    model file; and, with START=0, the commands to start it and what to do next."""
    ns, root = installed.ns, installed.ns.root
    for unit in UNITS:
        text = (root / "etc/systemd/system" / unit).read_text()
        assert text == (ROOT / "systemd" / unit).read_text()  # the default PREFIX: as shipped
        assert directives(text)["ExecStart"][-1].startswith("/opt/edged/bin/edged ")
    assert os.access(root / "opt/edged/bin/edged", os.X_OK)
    assert (root / "etc/sysusers.d/edged.conf").read_text() == (ROOT / "systemd/edged.sysusers.conf").read_text()
    user = next(line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("edged:"))
    assert user.split(":")[5:] == ["/var/lib/edged", "/usr/sbin/nologin"]
    config = root / "etc/edged/edged.toml"
    assert config.read_text() == (ROOT / "systemd/edged.toml").read_text() and config.stat().st_mode & 0o777 == 0o644
    artifacts = (root / "var/lib/edged/artifacts").stat()
    assert ((artifacts.st_uid, artifacts.st_gid), artifacts.st_mode & 0o777) == (ns.ids("edged"), 0o750)
    assert os.readlink(root / "usr/local/bin/edged") == "/opt/edged/bin/edged"

    probe = ns.run("/opt/edged/bin/python", "-c", "import edged, systemd.daemon, wyoming, uvicorn; "
                   "from edged.audio.vad import model_path; print(edged.__file__); print(model_path())", env={})
    assert probe.returncode == 0, probe.stderr
    where, model = probe.stdout.splitlines()
    assert where.startswith("/opt/edged/lib/") and where.endswith("/site-packages/edged/__init__.py")
    assert model.startswith("/opt/edged/lib/") and model.endswith("/silero_vad/data/silero_vad.onnx")
    assert (root / where.lstrip("/")).parent.joinpath("data/tiny/artifact.json").is_file()  # the built-in artifact

    out = installed.output
    assert "sudo systemctl daemon-reload && sudo systemctl enable --now edged edged-wyoming edged-http" in out
    for step in ("sudo usermod -aG edged", "systemctl status edged", "journalctl -u edged",
                 'artifact = "/var/lib/edged/artifacts/NAME"'):
        assert step in out, step
    print(f"install-system took {installed.seconds:.0f} s")


@AS_ROOT
@pytest.mark.parametrize("unit", UNITS)
def test_each_installed_unit_verifies_cleanly(installed, unit):
    """ExecStart's binary now exists, so verify checks the unit with nothing stubbed."""
    done = installed.ns.run("systemd-analyze", "verify", f"/etc/systemd/system/{unit}")
    assert (done.returncode, done.stderr) == (0, "")


class Unit:
    """The installed edged.service run as systemd would run it (see the module's docstring)."""

    def __init__(self, ns: Namespace, log_path: Path):
        root = ns.root
        service = directives((root / "etc/systemd/system/edged.service").read_text())
        self.unit = unit = {key: values[-1] for key, values in service.items()}
        self.argv = shlex.split(unit["ExecStart"])
        self.uid, self.gid = uid, gid = ns.ids(unit["User"])
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/var/lib/edged",
               "USER": unit["User"], "LOGNAME": unit["User"], "SHELL": "/usr/sbin/nologin", "LANG": "C.UTF-8",
               "WATCHDOG_USEC": str(int(unit["WatchdogSec"].removesuffix("s")) * 1_000_000)}
        for kind, base in (("Runtime", "/run"), ("State", "/var/lib"), ("Cache", "/var/cache"), ("Configuration", "/etc")):
            path = Path(base) / unit[f"{kind}Directory"]
            outside = root / str(path).lstrip("/")
            outside.mkdir(exist_ok=True)
            if kind != "Configuration":  # systemd leaves /etc/NAME to root
                os.chown(outside, uid, gid)
            outside.chmod(int(unit.get(f"{kind}DirectoryMode", "0755"), 8))
            env[f"{kind.upper()}_DIRECTORY"] = str(path)
        for assignment in service["Environment"]:
            for pair in shlex.split(assignment):
                name, _, value = pair.partition("=")
                env[name] = expand(value)
        groups = ns.run("id", "-Gn", unit["User"]).stdout.split() + unit["SupplementaryGroups"].split()
        self.notify = NotifySocket(f"@edged-install-{os.getpid()}")  # abstract: user edged reaches it
        env["NOTIFY_SOCKET"] = self.notify.address
        self.env, self.log_path = env, log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(ns.command("setpriv", f"--reuid={unit['User']}", f"--regid={unit['Group']}",
                                                    f"--groups={','.join(groups)}", "--no-new-privs", "--", *self.argv),
                                         env=env, cwd="/", umask=int(unit["UMask"], 8), stdout=log,
                                         stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def ready(self) -> None:
        self.notify.wait_for("READY=1", 120, self.proc, self.log)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()


def login(ns: Namespace, user: str, *useradd: str) -> dict[str, str]:
    """A user of the namespace (created unless there is one), with a login's empty runtime directory:
    the environment their commands run with."""
    if ns.run("id", user).returncode != 0:
        ns.run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *useradd, user)
    uid, gid = ns.ids(user)
    own = ns.root / f"run/user/{uid}"  # no daemon of its own
    own.mkdir(parents=True, exist_ok=True)
    os.chown(own, uid, gid)
    own.chmod(0o700)
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "USER": user,
            "XDG_RUNTIME_DIR": f"/run/user/{uid}"}


def as_user(ns: Namespace, user: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return ns.run("setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv, env=env, timeout=120)


@AS_ROOT
def test_the_installed_unit_boots_serves_group_edged_and_stops(installed, tmp_path):
    """1. The installed edged.service's ExecStart (`edged serve`, no --config) runs as user edged with
       its supplementary groups, its directories (/run/edged 0750 edged:edged, ...), their variables,
       its Environment= and UMask=0007, and reaches READY=1 on the installed /etc/edged/edged.toml (no
       sound card: the boot goes on without one).
    2. Its socket is /run/edged/edged.sock, edged:edged 0660: group edged may connect.
    3. A user in group edged runs the installed `edged status` with no --endpoint, its own runtime
       directory empty: it finds the daemon at /run/edged/edged.sock.
    4. A user not in group edged gets one line naming the socket and the group to join, exit 1.
    5. SIGTERM: STOPPING=1, exit 0."""
    ns, root = installed.ns, installed.ns.root
    unit = Unit(ns, tmp_path / "daemon.log")
    try:
        assert unit.argv == ["/opt/edged/bin/edged", "serve"]
        unit.ready()
        sock = (root / "run/edged/edged.sock").stat()
        assert ((sock.st_uid, sock.st_gid), sock.st_mode & 0o777) == ((unit.uid, unit.gid), 0o660)

        member = as_user(ns, "member", "/opt/edged/bin/edged", "status", "--json",
                         env=login(ns, "member", "--groups", "edged"))
        assert member.returncode == 0, member.stderr
        assert json.loads(member.stdout)["state"] == "serving"
        stranger = as_user(ns, "stranger", "/opt/edged/bin/edged", "status", "--json", env=login(ns, "stranger"))
        assert stranger.returncode == 1
        line = stranger.stderr.strip()
        assert "\n" not in line and line.startswith("edged status: no daemon found ("), stranger.stderr
        assert f"ipc:///run/edged/edged.sock: permission denied ({GROUP_HINT})" in line

        assert unit.stop() == 0, unit.log()
        unit.notify.receive(0.5)
        assert "STOPPING=1" in unit.notify.messages
    finally:
        unit.close()


@AS_ROOT
def test_the_readmes_systemd_recipe(installed, tmp_path):
    """The README's systemd recipe after its install line, as written, run as root (`sudo` is a shell
    function that runs its command) for a user `cook` whose home holds an artifact exported as the
    model recipe does (here the built-in one, whose speakers include vivian); `systemctl restart
    edged` is the unit run as above; the last line runs as cook, after the new login the recipe asks
    for. The daemon then serves the artifact the recipe configured."""
    from test_recipes import recipes

    ns, root = installed.ns, installed.ns.root
    lines = recipes()["systemd"]
    assert lines[0].split("#")[0].strip() == "sudo make install-system"
    restart = next(i for i, line in enumerate(lines) if line.split("#")[0].strip() == "sudo systemctl restart edged")
    before, after = lines[1:restart], lines[restart + 1:]
    config = root / "etc/edged/edged.toml"
    shipped = config.read_text()
    home = root / "var/home-cook"  # under an overlaid directory: the namespace's alone
    shutil.copytree(ROOT / "edged/data/tiny", home / "edged/0.6b-customvoice")
    env = login(ns, "cook") | {"HOME": "/var/home-cook"}
    steps = ns.run("bash", "-c", "set -euo pipefail\nsudo() { \"$@\"; }\n" + "\n".join(before),
                   env={**env, "PATH": os.environ["PATH"]})
    assert steps.returncode == 0, steps.stdout + steps.stderr
    unit = Unit(ns, tmp_path / "daemon.log")
    try:
        assert 'artifact = "/var/lib/edged/artifacts/0.6b-customvoice"' in config.read_text()
        unit.ready()
        said = as_user(ns, "cook", "bash", "-c", "set -euo pipefail\n" + "\n".join(after), env=env)
        assert said.returncode == 0, said.stdout + said.stderr
        assert json.loads(said.stdout)["reason"] in ("eos", "length")
        status = as_user(ns, "cook", "edged", "status", "--json", env=env)
        assert json.loads(status.stdout)["artifact"] == "/var/lib/edged/artifacts/0.6b-customvoice"
        assert unit.stop() == 0, unit.log()
    finally:
        unit.close()
        config.write_text(shipped)


@AS_ROOT
def test_a_second_install_keeps_the_users_config(installed):
    """Run again (an upgrade): the units and venv are written anew, /etc/edged/edged.toml is not."""
    config = installed.ns.root / "etc/edged/edged.toml"
    config.write_text('[daemon]\nlog_level = "debug"\n')
    done = installed.ns.run("bash", str(SCRIPT), env=install_env(), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert config.read_text() == '[daemon]\nlog_level = "debug"\n'
    assert "kept /etc/edged/edged.toml as it is" in done.stdout


STUB_VENV = """#!/bin/sh
# python -m venv --system-site-packages PREFIX: a venv whose pip and python record their calls
echo "venv $*" >> /opt/stub/calls
for last; do :; done
mkdir -p "$last/bin"
printf '#!/bin/sh\\necho "pip $*" >> /opt/stub/calls\\n' > "$last/bin/pip"
cp /opt/stub/venv-python "$last/bin/python"
ln -sf /opt/edged/bin/edged "$last/bin/edged"
ln -sf /opt/edged/bin/edged-engines "$last/bin/edged-engines"
chmod +x "$last/bin/pip" "$last/bin/python"
"""
VENV_PYTHON = """#!/bin/sh
# edged's own checks run for real, in the installed venv, on the TensorRT and pycuda of /opt/stub/site;
# the check that opens the GPU (`python -`) only records its call
echo "python $*" >> /opt/stub/calls
if [ "$1" = - ]; then cat > /dev/null; exit 0; fi
PYTHONPATH=/opt/stub/site exec /opt/edged/bin/python "$@"
"""


@AS_ROOT
def test_on_a_jetson_tensorrt_is_checked_before_anything_is_written(installed):
    """JETSON=1 with PREFIX=/opt/edged-jetson, JetPack's parts stood in for (dpkg-query says every package is
    there, an nvcc, a venv whose pip records its calls, and tensorrt and pycuda modules whose version the
    test sets), edged's TensorRT rule run for real by the installed edged:
    1. TensorRT 8.6.2 (JetPack 6.0): the one-line error, exit 1, and no unit or link written.
    2. TensorRT 10.3: every pip install takes the numpy 1.x constraints, pycuda is built from source, edged
       gets the jetson extra; the units' ExecStart follow PREFIX and verify cleanly; the next steps say
       how to build the plans."""
    ns, root = installed.ns, installed.ns.root
    stub = root / "opt/stub"
    for name, text in {"bin/dpkg-query": "#!/bin/sh\nprintf 'install ok installed'\n", "cuda/bin/nvcc": "#!/bin/sh\n",
                       "python3": STUB_VENV, "venv-python": VENV_PYTHON, "site/pycuda/__init__.py": "",
                       "site/pycuda/driver.py": ""}.items():
        (stub / name).parent.mkdir(parents=True, exist_ok=True)
        (stub / name).write_text(text)
        (stub / name).chmod(0o755)
    env = install_env(JETSON="1", DOORS="0", PREFIX="/opt/edged-jetson", PYTHON="/opt/stub/python3",
                      CUDA_HOME="/opt/stub/cuda", PATH=f"/opt/stub/bin:{os.environ['PATH']}")
    unit = root / "etc/systemd/system/edged.service"
    shipped = (ROOT / "systemd/edged.service").read_text()

    (stub / "site/tensorrt").mkdir()
    (stub / "site/tensorrt/__init__.py").write_text('__version__ = "8.6.2"\n')
    done = ns.run("bash", str(SCRIPT), env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "TensorRT 8.6.2 found; edged needs TensorRT >= 10.3 (JetPack 6.1 or later)"
    assert unit.read_text() == shipped and os.readlink(root / "usr/local/bin/edged") == "/opt/edged/bin/edged"

    (stub / "calls").unlink()
    (stub / "site/tensorrt/__init__.py").write_text('__version__ = "10.3.0.30"\n')
    done = ns.run("bash", str(SCRIPT), env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TensorRT 10.3.0.30 and pycuda: the tensorrt backend can load" in done.stdout
    calls = (stub / "calls").read_text().splitlines()
    assert calls[0] == "venv -m venv --system-site-packages /opt/edged-jetson"
    pip = [line.split(" ", 1)[1] for line in calls if line.startswith("pip ")]
    assert all(args.startswith("install -q -c scripts/jetson-constraints.txt ") for args in pip), pip
    assert any(args.endswith(" --no-binary pycuda pycuda>=2022.2") for args in pip), pip
    assert any(args.endswith("[systemd,jetson]") for args in pip), pip
    assert [line for line in calls if line.startswith("python ")] == ["python -m edged.backends.tensorrt_version",
                                                                      "python -"]
    assert unit.read_text() == shipped.replace("/opt/edged/bin/edged", "/opt/edged-jetson/bin/edged")
    assert os.readlink(root / "usr/local/bin/edged") == "/opt/edged-jetson/bin/edged"
    verified = ns.run("systemd-analyze", "verify", "/etc/systemd/system/edged.service")
    assert (verified.returncode, verified.stderr) == (0, "")
    assert "sudo /opt/edged-jetson/bin/edged-engines plans /var/lib/edged/artifacts/NAME" in done.stdout


@AS_ROOT
def test_the_host_is_as_it_was(installed):
    """Two installs, a daemon and two users later: the host's /etc, /opt, /var, /usr/local and /run are
    as they were (the namespace's own file shows what the host's would have held)."""
    assert snapshot(HOST_PATHS) == installed.host
    assert (installed.ns.root / "etc/sysusers.d/edged.conf").is_file()


@pytest.mark.parametrize("prefix", ["/home/someone/edged", "/root/edged", "/tmp/edged", "opt/edged"])
def test_a_prefix_the_unit_cannot_see_is_refused_before_anything_is_done(prefix):
    """ProtectHome=yes hides /home and /root, PrivateTmp=yes /tmp: a venv there could never start. Run
    unprivileged (as nobody, from a copy of the scripts), so a refusal that failed could write nothing."""
    copy = Path(tempfile.mkdtemp(prefix="edged-install-"))
    try:
        (copy / "scripts").mkdir()
        for name in ("install-system.sh", "install-lib.sh"):
            shutil.copy(ROOT / "scripts" / name, copy / "scripts" / name)
        copy.chmod(0o755)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*nobody, "bash", str(copy / "scripts/install-system.sh")], capture_output=True, text=True,
                              env=install_env(PREFIX=prefix), cwd="/", timeout=60, check=False)
    finally:
        shutil.rmtree(copy)
    assert done.returncode == 1 and done.stdout == ""
    absolute = "PREFIX must be an absolute path" if not prefix.startswith("/") else \
        f"PREFIX={prefix}: the unit cannot see it (ProtectHome=yes hides /home, /root and /run/user; PrivateTmp=yes /tmp)"
    assert done.stderr.startswith(f"install-system: {absolute}") and done.stderr.count("\n") == 1, done.stderr
