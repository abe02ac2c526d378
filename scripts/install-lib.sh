# What scripts/install-jetson.sh and scripts/install-system.sh share; sourced from the checkout's root,
# never run. Each function takes the calling script's name (WHO) for its messages.

# missing_packages PKG...: those of the Debian packages that are not installed, on one line.
missing_packages() {
    local package missing=()
    for package in "$@"; do
        [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" = "install ok installed" ] || missing+=("$package")
    done
    echo "${missing[*]}"
}

# ensure_packages WHO PKG...: as root, installs the missing ones (apt-get, no prompts); otherwise lists
# them with the apt command and exits 1. Nothing to do when all are installed.
ensure_packages() {
    local who=$1 missing
    shift
    read -ra missing <<< "$(missing_packages "$@")"
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "$who: missing Debian packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# tensorrt_check WHO PYTHON: JetPack's TensorRT, as PYTHON imports it, is one edged runs on, by edged's
# own rule (edged/backends/tensorrt_version.py, from this checkout): otherwise one line naming the
# version found and the one needed (JetPack 6.0's TensorRT 8.6 is refused here) and exit 1, before
# anything is built or installed.
tensorrt_check() {
    local who=$1 python=$2
    "$python" - "$who" <<'PY' || exit 1
import sys

sys.path.insert(0, ".")  # the checkout's edged: the venv does not exist yet
from edged.backends.tensorrt_version import NEEDED, refusal

who = sys.argv[1]
try:
    import tensorrt
except ImportError as exc:
    sys.exit(f"{who}: no TensorRT Python bindings ({exc}); edged needs {NEEDED}: apt-get install python3-libnvinfer")
reason = refusal(tensorrt.__version__)
if reason is not None:
    sys.exit(f"{who}: {reason}")
print(f"{who}: TensorRT {tensorrt.__version__}")
PY
}

# jetson_venv WHO VENV PYTHON CUDA_HOME: a virtual environment that sees JetPack's tensorrt
# (--system-site-packages), with pycuda built from source against the installed CUDA (nvcc). Sets `pip`,
# the install command every later install into it takes: scripts/jetson-constraints.txt keeps numpy 1.x,
# which TensorRT 10.3's bindings were built against.
jetson_venv() {
    local who=$1 venv=$2 python=$3 cuda_home=$4
    if [ ! -x "$cuda_home/bin/nvcc" ]; then
        echo "$who: no nvcc in $cuda_home/bin: install JetPack's CUDA toolkit (or set CUDA_HOME)" >&2
        exit 1
    fi
    "$python" -m venv --system-site-packages "$venv"
    pip=("$venv/bin/pip" install -q -c scripts/jetson-constraints.txt)
    "${pip[@]}" --upgrade pip
    PATH="$cuda_home/bin:$PATH" CUDA_ROOT="$cuda_home" "${pip[@]}" --no-binary pycuda 'pycuda>=2022.2'
}

# jetson_check VENV: edged's rule (TensorRT >= 10.3, pycuda; one line and exit 1 otherwise), then numpy
# 1.x, the GPU, and the TensorRT backend opening and closing (pushing and popping its CUDA context).
# From /: the venv's edged, not the checkout's (python puts the working directory first on its path).
jetson_check() {
    local venv
    venv=$(cd "$1" && pwd)
    (cd / && "$venv/bin/python" -m edged.backends.tensorrt_version) || exit 1
    (cd / && "$venv/bin/python" -) <<'PY'
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
}
