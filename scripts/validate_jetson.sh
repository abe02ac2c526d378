#!/usr/bin/env bash
# Validate the TensorRT backend on a Jetson (JetPack 6, TensorRT 10, pycuda installed):
# build plans for a copy of the built-in artifact, run the backend conformance tests on TensorRT,
# and check that greedy synthesis on TensorRT gives the same codec frames as ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import tensorrt, pycuda; print('tensorrt', tensorrt.__version__)"
work=$(mktemp -d)
cp -r edged/data/tiny "$work/tiny"
edged-engines plans "$work/tiny"
EDGED_TEST_BACKEND=tensorrt EDGED_TEST_ARTIFACT="$work/tiny" python3 -m pytest -q tests/backends
for backend in onnxruntime tensorrt; do
  edged synth --artifact "$work/tiny" --backend "$backend" --greedy --max-frames 40 \
    --text "Validating the TensorRT backend." --out "$work/$backend.wav" --codes "$work/$backend.json" >/dev/null
done
python3 - "$work" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{n}.json"))["frames"] for n in ("onnxruntime", "tensorrt"))
same = sum(x == y for x, y in zip(a, b))
print(f"greedy frames equal on {same}/{len(a)} frames")
sys.exit(0 if a == b else 1)
PY
echo "TensorRT backend validated"
