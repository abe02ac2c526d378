"""Code style and types are part of the test suite: scripts/lint.sh (ruff + mypy) must pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_lint_and_types():
    env = {**os.environ, "BIN": str(Path(sys.executable).parent)}
    done = subprocess.run(["bash", str(REPO / "scripts" / "lint.sh")], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
