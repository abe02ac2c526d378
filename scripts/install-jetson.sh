#!/usr/bin/env bash
# Install edged on a Jetson (JetPack 6.x: TensorRT 10.3, CUDA 12.6, Python 3.10), then check it.
#
#   sudo apt-get install python3-libnvinfer python3-venv python3-dev libsystemd-dev pkg-config   # or run this as root
#   scripts/install-jetson.sh            # VENV=.venv  PYTHON=/usr/bin/python3  CUDA_HOME=/usr/local/cuda
#
# 1. JetPack's packages: TensorRT's Python bindings (python3-libnvinfer; there is no TensorRT wheel for
#    Jetson on the package index), venv and headers, libsystemd for the systemd extra. As root, missing
#    ones are installed; otherwise they are listed and the script stops.
# 2. A virtual environment with --system-site-packages, so it sees JetPack's `tensorrt`. Every pip
#    install below takes scripts/jetson-constraints.txt: numpy stays 1.x, the numpy TensorRT 10.3's
#    bindings were built against.
# 3. pycuda built from source against the installed CUDA (nvcc on PATH; `edged-engines plans` also
#    compiles the backend's kernels with it).
# 4. edged with its systemd and jetson extras (pycuda; onnx, which `edged-engines fp16` and `quantize`
#    need for validate_jetson.py --fp16 / --weights), and pytest, which validate_jetson.py runs the
#    backend tests with.
# 5. The check: tensorrt and pycuda import, numpy is 1.x, the GPU is there, and the TensorRT backend
#    opens and closes (pushes and pops its CUDA context). Then build plans for an artifact:
#    edged-engines plans ARTIFACT; then scripts/validate_jetson.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-/usr/bin/python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

packages=(python3-libnvinfer python3-venv python3-dev libsystemd-dev pkg-config)
missing=()
for package in "${packages[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" = "install ok installed" ] || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-jetson: missing JetPack packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "install-jetson: no nvcc in $CUDA_HOME/bin: install JetPack's CUDA toolkit (or set CUDA_HOME)" >&2
    exit 1
fi

"$PYTHON" -m venv --system-site-packages "$VENV"
pip=("$VENV/bin/pip" install -q -c scripts/jetson-constraints.txt)
"${pip[@]}" --upgrade pip
PATH="$CUDA_HOME/bin:$PATH" CUDA_ROOT="$CUDA_HOME" "${pip[@]}" --no-binary pycuda 'pycuda>=2022.2'
"${pip[@]}" -e '.[systemd,jetson]' 'pytest>=8'
"${pip[@]}" --no-deps silero-vad==6.2.3

"$VENV/bin/python" - <<'PY'
import numpy
import pycuda.driver as cuda
import tensorrt

assert numpy.__version__.startswith("1."), f"numpy {numpy.__version__}: TensorRT 10.3's bindings take numpy 1.x"
cuda.init()
print(f"tensorrt {tensorrt.__version__}; {cuda.Device.count()} CUDA device(s): {cuda.Device(0).name()}")
from edged.backends import make_backend

backend = make_backend("tensorrt")
backend.close()
print("the tensorrt backend opens and closes its CUDA context")
PY
echo "install-jetson: done. Next: $VENV/bin/edged-engines plans ARTIFACT, then scripts/validate_jetson.sh"
