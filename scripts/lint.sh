#!/usr/bin/env bash
# The one gate for code style and types: ruff (lint) and mypy (the runtime package).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.venv/bin}
"$bin/ruff" check edged engines scripts tests
"$bin/mypy" edged
