#!/usr/bin/env bash
# The device acceptance run of the TensorRT backend (JetPack 6, after scripts/install-jetson.sh):
# plans, backend tests, fp32 parity with ONNX Runtime, optional fp16 quality and the int4 twin in its
# Jetson form (--weights int4, with its size, engine-inspector and speed rows), memory by stage, a
# 4-client soak under the installed edged.service (`sudo make install-system` first; --soak direct
# runs the daemon directly) with TTFA/RTF/per-stage timings and peak memory, and a SIGTERM exit-0
# check; one summary table at the end.
# Options are those of scripts/validate_jetson.py (e.g. --clocks --fp16 --soak-requests 25).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/validate_jetson.py --backend tensorrt "$@"
