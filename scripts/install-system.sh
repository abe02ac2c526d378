#!/usr/bin/env bash
# edged as a systemd service, on Debian/Ubuntu and on JetPack: `sudo make install-system` (docs/daemon.md).
#
#   PREFIX=/opt/edged          the virtual environment; outside /home, /root and /tmp, which the unit hides
#   DOORS=1                    also the front doors: the doors extra, edged-wyoming.service and edged-http.service
#   JETSON=1|0                 a Jetson or not (default: a Jetson when /etc/nv_tegra_release exists)
#   CUDA_HOME=/usr/local/cuda  a Jetson's CUDA, which pycuda is built against
#   START=0                    install only: neither enable nor start the units
#   PYTHON=/usr/bin/python3    the interpreter the virtual environment is made from
#   BINDIR=/usr/local/bin      where `edged` and `edged-engines` are linked to PREFIX's
#
# 1. Debian packages: python3-venv, libportaudio2 (sounddevice), libsystemd-dev pkg-config gcc
#    python3-dev (systemd-python builds from source); on a Jetson python3-libnvinfer (TensorRT's bindings).
#    Missing ones are installed as root; otherwise listed with the apt command, and the script stops.
# 2. PREFIX: a virtual environment with edged from this checkout, not editable (the unit's ProtectHome=yes
#    hides a checkout under /home), with the systemd extra (+ doors with DOORS=1), and the VAD's model
#    file. On a Jetson as scripts/install-jetson.sh does it (scripts/install-lib.sh): --system-site-packages
#    for JetPack's tensorrt, numpy 1.x, pycuda built against CUDA_HOME, the jetson extra; then edged's
#    check (TensorRT >= 10.3, pycuda; one line naming what was found otherwise) and the backend opening.
# 3. User and group edged (/etc/sysusers.d/edged.conf, systemd-sysusers); the units in /etc/systemd/system,
#    ExecStart at PREFIX/bin/edged; /etc/edged/edged.toml when there is none (every key commented out at
#    its default: systemd/edged.toml); /var/lib/edged/artifacts for artifacts (user edged reads it).
# 4. With systemd running (and START not 0): daemon-reload, enable, (re)start. Otherwise the commands.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-lib.sh
umask 022  # user edged reads the environment and the config whatever the caller's umask

PREFIX=${PREFIX:-/opt/edged}
DOORS=${DOORS:-0}
START=${START:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BINDIR=${BINDIR:-/usr/local/bin}
if [ -z "${JETSON:-}" ]; then
    JETSON=0
    [ -e /etc/nv_tegra_release ] && JETSON=1
fi
SHIPPED_PREFIX=/opt/edged  # the units' ExecStart
ARTIFACTS=/var/lib/edged/artifacts

say() { echo "install-system: $*"; }
fail() { echo "install-system: $*" >&2; exit 1; }
# Paths the unit cannot see: ProtectHome=yes (/home, /root, /run/user) and PrivateTmp=yes (/tmp, /var/tmp).
hidden() { case "$1/" in /home/*|/root/*|/run/user/*|/tmp/*|/var/tmp/*) return 0 ;; *) return 1 ;; esac; }

case "$PREFIX" in /*) ;; *) fail "PREFIX must be an absolute path, got $PREFIX" ;; esac
PREFIX=${PREFIX%/}
hidden "$PREFIX" && fail "PREFIX=$PREFIX: the unit cannot see it (ProtectHome=yes hides /home, /root and /run/user; PrivateTmp=yes /tmp): use a path such as /opt/edged"
interpreter=$(readlink -f "$(command -v "$PYTHON")") || fail "PYTHON=$PYTHON: no such interpreter"
hidden "$interpreter" && fail "PYTHON=$PYTHON is $interpreter, which the unit cannot see (ProtectHome=yes): use the system's, /usr/bin/python3"

packages=(python3-venv libportaudio2 libsystemd-dev pkg-config gcc python3-dev)
[ "$JETSON" = 1 ] && packages+=(python3-libnvinfer)
ensure_packages install-system "${packages[@]}"
[ "$(id -u)" -eq 0 ] || fail "it writes to /etc and $PREFIX: run it as root (sudo make install-system)"

# --- 2. the virtual environment ---
extras=systemd
[ "$DOORS" = 1 ] && extras+=,doors
if [ "$JETSON" = 1 ]; then
    extras+=,jetson
    jetson_venv install-system "$PREFIX" "$PYTHON" "$CUDA_HOME"  # sets pip: numpy 1.x
else
    "$PYTHON" -m venv "$PREFIX"
    pip=("$PREFIX/bin/pip" install -q)
fi
# Built from a copy of what the package is made of: pip builds in the source tree, which would leave
# root's build/ and egg-info in the checkout.
source_copy=$(mktemp -d)
trap 'rm -rf "$source_copy"' EXIT
tar -cf - --exclude=__pycache__ pyproject.toml README.md edged engines | tar -xf - -C "$source_copy"
"${pip[@]}" "$source_copy[$extras]"  # pip reinstalls a directory's package even at the same version
"${pip[@]}" --no-deps silero-vad==6.2.3  # the VAD's model file (its own code would pull in torch)
[ "$JETSON" = 1 ] && jetson_check "$PREFIX"
client=edged  # how the next steps below call it
for command in edged edged-engines; do
    if [ ! -e "$BINDIR/$command" ] || [ -L "$BINDIR/$command" ]; then
        ln -sfn "$PREFIX/bin/$command" "$BINDIR/$command"
    else
        say "left $BINDIR/$command as it is (another install's; $PREFIX/bin/$command is this one)"
        [ "$command" = edged ] && client=$PREFIX/bin/edged
    fi
done
say "edged ($extras) is in $PREFIX"

# --- 3. user, units, config, artifacts ---
install -D -m 0644 systemd/edged.sysusers.conf /etc/sysusers.d/edged.conf
systemd-sysusers /etc/sysusers.d/edged.conf
units=(edged.service)
[ "$DOORS" = 1 ] && units+=(edged-wyoming.service edged-http.service)
for unit in "${units[@]}"; do
    if [ "$PREFIX" = "$SHIPPED_PREFIX" ]; then
        install -m 0644 "systemd/$unit" "/etc/systemd/system/$unit"
    else
        sed "s|$SHIPPED_PREFIX/bin/edged|$PREFIX/bin/edged|g" "systemd/$unit" > "/etc/systemd/system/$unit"
        chmod 0644 "/etc/systemd/system/$unit"
    fi
done
say "units in /etc/systemd/system: ${units[*]}"
install -d -m 0755 /etc/edged
if [ -e /etc/edged/edged.toml ]; then
    say "kept /etc/edged/edged.toml as it is"
else
    install -m 0644 systemd/edged.toml /etc/edged/edged.toml
    say "wrote /etc/edged/edged.toml (every key commented out at its default)"
fi
install -d -m 0750 -o edged -g edged /var/lib/edged "$ARTIFACTS"

# --- 4. start ---
names=("${units[@]%.service}")
if [ "$START" = 0 ]; then
    say "not started (START=0). To start it: sudo systemctl daemon-reload && sudo systemctl enable --now ${names[*]}"
elif [ ! -d /run/systemd/system ]; then
    say "systemd is not running here. Where it runs: sudo systemctl daemon-reload && sudo systemctl enable --now ${names[*]}"
else
    systemctl daemon-reload
    systemctl enable "${units[@]}"
    systemctl restart "${units[@]}" || fail "${names[*]} did not start: journalctl -u edged -b says why"
    say "enabled and started: ${names[*]}"
fi

cat <<EOF

Next:
- To use \`edged say\`, \`edged status\` and the other clients as yourself (they reach the daemon at
  /run/edged/edged.sock, which group edged may connect to), join the group, then log in again:
    sudo usermod -aG edged ${SUDO_USER:-\$USER}
- Is it serving?  systemctl status edged   (and: $client status)
- Its log:        journalctl -u edged   (-f to follow)
- An artifact:    sudo cp -r ARTIFACT $ARTIFACTS/NAME && sudo chown -R edged:edged $ARTIFACTS/NAME
  then, under [daemon] in /etc/edged/edged.toml: artifact = "$ARTIFACTS/NAME", and: sudo systemctl restart edged
EOF
if [ "$JETSON" = 1 ]; then
    cat <<EOF
- On this Jetson, build the artifact's TensorRT plans first (then the chown again):
    sudo $PREFIX/bin/edged-engines plans $ARTIFACTS/NAME
  and set backend = "tensorrt" under [daemon] too.
EOF
fi
