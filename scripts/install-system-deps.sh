#!/usr/bin/env bash
# Debian/Ubuntu packages that edged's tests and daemon need beyond pip. Idempotent.
#
#   libsystemd-dev pkg-config gcc   build systemd-python (the `systemd` extra; PyPI has no wheels)
#   python3-dev                     Python.h of the system's python3, which `make install-system` builds with
#   systemd                         systemd-journald, journalctl, systemd-analyze, systemd-sysusers
#   python3-venv                    the virtual environment `make install-system` makes (tests/systemd/test_install.py)
#   util-linux mount                unshare(1) and mount(8): the journald and unit tests
#   jackd2 libportaudio2            audio: the JACK dummy backend and sounddevice's PortAudio
#   procps                          pgrep: the audio tests check that no JACK server runs before clearing its leftovers
#   espeak-ng                       speech for the VAD tests and scripts/bench/vad.py
#   curl                            the README's front-door recipe (tests/test_recipes.py runs it)
#   libspeexdsp1                    speexdsp's echo canceller, which scripts/bench/echo.py measures edged's against
#   qemu-user                       qemu-x86_64 -cpu MODEL: ONNX Runtime's 8-bit kernels of other x86 CPUs (the int8
#                                   vocoder's saturating AVX2 path and the exact SSE one: tests/engines/test_vocoder_int8.py);
#                                   qemu-aarch64: its ARM64 kernels (tests/engines/test_vocoder_arm64.py)
#
# As root: installs what is missing (apt-get update + install, no prompts; nothing to do when all
# is present). Not root: exits 0 if everything is present, else lists what is missing and exits 1.
set -euo pipefail

packages=(libsystemd-dev pkg-config gcc python3-dev python3-venv systemd util-linux mount jackd2 libportaudio2 espeak-ng curl
          procps libspeexdsp1 qemu-user)

missing=()
for package in "${packages[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$package")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system-deps: all present (${packages[*]})"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: missing Debian packages: ${missing[*]}" >&2
    echo "install them as root:  sudo $0   (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# jackd2 asks whether to enable real-time priority for group audio; answer no, without asking.
echo "jackd2 jackd/tweak_rt_limits boolean false" | debconf-set-selections
apt-get update -q
apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
echo "install-system-deps: installed ${missing[*]}"
