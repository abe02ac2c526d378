"""No PortAudio library (Debian's libportaudio2 not installed): the daemon boots with a named warning,
says in `status` that there is no speaker and no microphone and why, plays nothing as
`audio.on_missing_device` says; `edged devices` exits 2 with the same line.

How the library is made missing: sounddevice finds it with `ctypes.util.find_library("portaudio")`
(on Linux the dynamic loader's cache, `ldconfig -p`; then gcc's and ld's search for a
libportaudio.so), then dlopens what it found. Inside `unshare --mount`, every libportaudio file the
loader's cache names is covered by an empty file and the cache by one rebuilt without them, so
sounddevice's import raises its own OSError("PortAudio library not found"), as on a machine without
the package; the rest of the machine is untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support.daemon import Daemon

from edged.client import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ldconfig") is None,
                                reason="needs root, unshare(1) and ldconfig for a private mount namespace")

HIDE = """set -e
: > "$0/empty"
for lib in LIBS; do mount --bind "$0/empty" "$lib"; done
ldconfig -X -C "$0/ld.so.cache" 2>/dev/null
mount --bind "$0/ld.so.cache" /etc/ld.so.cache
exec "$@"
"""
"""$0: a scratch directory; then the command to run without PortAudio."""
WHY = ("no PortAudio library: install libportaudio2 (Debian/Ubuntu) or your system's PortAudio package and restart: "
       "no speaker and no microphone (PortAudio library not found)")


def portaudio_files() -> list[str]:
    """The files behind every libportaudio the dynamic loader's cache names."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    paths = {line.rsplit("=> ", 1)[1].strip() for line in listed.splitlines() if "libportaudio" in line}
    return sorted({os.path.realpath(p) for p in paths})


@pytest.fixture
def without_portaudio(tmp_path) -> tuple[str, ...]:
    """A command prefix that runs its command where PortAudio cannot be found."""
    files = portaudio_files()
    if not files:
        pytest.skip("no PortAudio library is installed to hide")
    scratch = tmp_path / "hide"
    scratch.mkdir()
    script = HIDE.replace("LIBS", " ".join(f"'{f}'" for f in files))
    return ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(scratch))


def test_without_portaudio_the_daemon_says_so_and_serves(tmp_path, without_portaudio):
    """1. sounddevice itself cannot find the library in the namespace (what the test hides is what it looks for).
       2. The daemon boots with the warning, and status gives both streams state "unavailable" with it.
       3. `edged status` shows it; a speak with play: true is generated and heard nowhere.
       4. `edged devices` exits 2 with the same line."""
    probe = subprocess.run([*without_portaudio, sys.executable, "-c", "import sounddevice"], capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 1 and probe.stderr.strip().endswith("OSError: PortAudio library not found"), probe.stderr

    daemon = Daemon(tmp_path, wrap=without_portaudio,
                    config='[events]\nlisten = "none"\n[audio]\ndevice = ""\ninput_device = ""\n')
    try:
        with Client(daemon.endpoint) as client:
            audio = client.status()["audio"]
            done = client.speak("Hello there.", max_audio_ms=400).wait()
        shown = subprocess.run([sys.executable, "-m", "edged", "status", "--endpoint", daemon.endpoint],
                               capture_output=True, text=True, timeout=60)
        assert daemon.terminate() == 0
        log = daemon.read_log()
    finally:
        daemon.close()
    assert audio == {"output": {"state": "unavailable", "error": WHY}, "input": {"state": "unavailable", "error": WHY}}
    assert f"WARNING edged.daemon: {WHY}" in log
    assert done.reason == "length" and done.report["played_ms"] == 0 and done.report["playback"] == "no output device"
    rows = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert rows["speaker"] == rows["microphone"] == f"unavailable ({WHY})"

    devices = subprocess.run([*without_portaudio, sys.executable, "-m", "edged", "devices"], capture_output=True,
                             text=True, timeout=60)
    assert (devices.returncode, devices.stdout, devices.stderr) == (2, "", f"edged devices: {WHY}\n")
    assert portaudio_files()  # outside the namespace the library is still there
