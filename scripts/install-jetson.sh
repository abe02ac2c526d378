#!/usr/bin/env bash
# Install edged on a Jetson for development in this checkout (JetPack 6.1+: TensorRT 10.3, CUDA 12.6,
# Python 3.10), then check it. As a service: `sudo make install-system` (docs/daemon.md).
#
#   sudo apt-get install python3-libnvinfer python3-venv python3-dev libsystemd-dev pkg-config   # or run this as root
#   scripts/install-jetson.sh            # VENV=.venv  PYTHON=/usr/bin/python3  CUDA_HOME=/usr/local/cuda
#
# 1. JetPack's packages: TensorRT's Python bindings (python3-libnvinfer; there is no TensorRT wheel for
#    Jetson on the package index), venv and headers, libsystemd for the systemd extra. As root, missing
#    ones are installed; otherwise they are listed and the script stops.
# 2. JetPack's TensorRT checked by edged's rule (>= 10.3; JetPack 6.0's 8.6 is refused in one line
#    naming it) before anything is built. A virtual environment with --system-site-packages, so it sees
#    JetPack's `tensorrt`. Every pip install below takes scripts/jetson-constraints.txt: numpy stays
#    1.x, the numpy TensorRT 10.3's bindings were built against.
# 3. pycuda built from source against the installed CUDA (nvcc on PATH; `edged-engines plans` also
#    compiles the backend's kernels with it).
# 4. edged (editable) with its systemd and jetson extras (pycuda; onnx, which `edged-engines fp16` and
#    `quantize` need for validate_jetson.py --fp16 / --weights), and pytest, which validate_jetson.py
#    runs the backend tests with.
# 5. The check: TensorRT >= 10.3 and pycuda (edged.backends.tensorrt_version: one line naming what was
#    found otherwise), numpy is 1.x, the GPU is there, and the TensorRT backend opens and closes (pushes
#    and pops its CUDA context). Then build plans for an artifact: edged-engines plans ARTIFACT; then
#    scripts/validate_jetson.sh.
# Steps 1-3 and 5 are scripts/install-lib.sh's, which scripts/install-system.sh runs on a Jetson too (its
# TensorRT check is step 5's, before it writes anything to /etc).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-lib.sh
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-/usr/bin/python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

ensure_packages install-jetson python3-libnvinfer python3-venv python3-dev libsystemd-dev pkg-config
tensorrt_check install-jetson "$PYTHON"
jetson_venv install-jetson "$VENV" "$PYTHON" "$CUDA_HOME"
"${pip[@]}" -e '.[systemd,jetson]' 'pytest>=8'
"${pip[@]}" --no-deps silero-vad==6.2.3
jetson_check "$VENV"
echo "install-jetson: done. Next: $VENV/bin/edged-engines plans ARTIFACT, then scripts/validate_jetson.sh"
