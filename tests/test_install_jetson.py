"""scripts/install-jetson.sh, run here with JetPack's tools replaced by recorders (dpkg-query says every
package is installed, nvcc exists, the venv's pip and python write down how they were called): every
pip install is constrained to numpy 1.x (TensorRT 10.3's bindings were built against it), and what
scripts/validate_jetson.py needs on the device is installed: onnx (its --fp16 and --weights twins),
pycuda and pytest (its backend tests); and edged's TensorRT version rule is checked first, with the system's
Python (a stand-in `tensorrt` module of a chosen version), before anything is built, and again before the
backend opens: JetPack 6.0's TensorRT 8.6 stops the install in one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def install_jetson(tmp_path: Path, tensorrt_version: str) -> subprocess.CompletedProcess:
    """scripts/install-jetson.sh with recorders for JetPack's tools; the system Python is this one, seeing
    a `tensorrt` module of `tensorrt_version`."""
    calls = tmp_path / "calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "jetpack").mkdir()
    (tmp_path / "jetpack" / "tensorrt.py").write_text(f"__version__ = {tensorrt_version!r}\n")
    stubs = {
        tmp_path / "bin" / "dpkg-query": "echo 'install ok installed'",
        tmp_path / "cuda" / "bin" / "nvcc": "exit 0",
        tmp_path / "python": f"""if [ "$1 $2" != "-m venv" ]; then
    PYTHONPATH={tmp_path / "jetpack"} exec {sys.executable} "$@"
fi
venv="${{@: -1}}"; mkdir -p "$venv/bin"
printf '#!/bin/sh\\necho "pip $*" >> {calls}\\n' > "$venv/bin/pip"
printf '#!/bin/sh\\necho "python $*" >> {calls}\\nif [ "$1" = - ]; then cat > {tmp_path}/check.py; fi\\n' > "$venv/bin/python"
chmod +x "$venv/bin/pip" "$venv/bin/python"
""",
    }
    for path, body in stubs.items():
        path.write_text("#!/bin/bash\n" + body + "\n")
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "VENV": str(tmp_path / "venv"),
           "PYTHON": str(tmp_path / "python"), "CUDA_HOME": str(tmp_path / "cuda")}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "scripts/install-jetson.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("version", ["8.6.2", "10.2.0.19"])
def test_install_jetson_refuses_an_older_tensorrt_in_one_line_before_building_anything(tmp_path, version):
    """JetPack 6.0 ships TensorRT 8.6: edged's rule (edged/backends/tensorrt_version.py) names it and the
    install stops before it makes the venv or builds pycuda."""
    done = install_jetson(tmp_path, version)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"install-jetson: TensorRT {version} found; edged needs TensorRT >= 10.3 "
                                        f"(JetPack 6.1 or later)"], done.stderr
    assert not (tmp_path / "venv").exists() and not (tmp_path / "calls").exists()


def test_install_jetson_constrains_numpy_and_installs_what_validation_uses(tmp_path):
    calls = tmp_path / "calls"
    done = install_jetson(tmp_path, "10.3.0.30")
    assert done.returncode == 0, done.stderr
    assert "install-jetson: TensorRT 10.3.0.30\n" in done.stdout
    pip = [line.split()[1:] for line in calls.read_text().splitlines() if line.startswith("pip ")]
    assert pip and all(args[:4] == ["install", "-q", "-c", "scripts/jetson-constraints.txt"] for args in pip), pip
    constraints = [line for line in (ROOT / "scripts/jetson-constraints.txt").read_text().splitlines()
                   if line and not line.startswith("#")]
    assert constraints == ["numpy<2"]
    installed = {arg for args in pip for arg in args[4:] if not arg.startswith("-")}
    assert {".[systemd,jetson]", "pytest>=8", "pycuda>=2022.2"} <= installed, installed
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("onnx") for req in extras["jetson"]) and "assert numpy.__version__.startswith(\"1.\")" \
        in (tmp_path / "check.py").read_text()
    # edged's own TensorRT rule (>= 10.3, pycuda) runs first, then the check that opens the backend
    python = [line for line in calls.read_text().splitlines() if line.startswith("python ")]
    assert python == ["python -m edged.backends.tensorrt_version", "python -"], python
