"""edged with the TensorRT, pycuda and CUDA driver doubles in place of JetPack's:
`python tests/support/with_fake_trt.py VERSION ARGS...` runs `edged ARGS...` as if TensorRT VERSION
were installed (fake_trt.py), so a test can boot the daemon with `backend = "tensorrt"`. Needs tests/
on PYTHONPATH (the `support` package). $EDGED_TEST_CAPTURE_UNSAFE: ONNX file names (comma-separated)
whose engines cannot be captured as CUDA graphs (fake_trt.CAPTURE_UNSAFE)."""

from __future__ import annotations

import os
import sys

import pytest
from support import fake_trt

if __name__ == "__main__":
    doubles = fake_trt.install(pytest.MonkeyPatch())
    doubles.trt.__version__ = sys.argv[1]
    fake_trt.CAPTURE_UNSAFE.update(filter(None, os.environ.get("EDGED_TEST_CAPTURE_UNSAFE", "").split(",")))
    from edged.cli import main

    sys.exit(main(sys.argv[2:]))
