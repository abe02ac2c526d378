"""scripts/install-jetson.sh, run here with JetPack's tools replaced by recorders (dpkg-query says every
package is installed, nvcc exists, the venv's pip and python write down how they were called): every
pip install is constrained to numpy 1.x (TensorRT 10.3's bindings were built against it), and what
scripts/validate_jetson.py needs on the device is installed: onnx (its --fp16 and --weights twins),
pycuda and pytest (its backend tests); and edged's TensorRT version rule is checked before the backend opens."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_install_jetson_constrains_numpy_and_installs_what_validation_uses(tmp_path):
    calls = tmp_path / "calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    stubs = {
        tmp_path / "bin" / "dpkg-query": "echo 'install ok installed'",
        tmp_path / "cuda" / "bin" / "nvcc": "exit 0",
        tmp_path / "python": f"""[ "$1 $2" = "-m venv" ] || exit 1
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
    done = subprocess.run(["bash", "scripts/install-jetson.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
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
