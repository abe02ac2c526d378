"""The TensorRT edged runs on, said in one place: 10.3 or later (JetPack 6.1 and later).

JetPack 6.0 ships TensorRT 8.6, which lacks what the backend and `edged-engines plans` use (the
USER_MANAGED activations, `device_memory_size_v2`, strongly typed networks); without this check it
fails at boot with an AttributeError. The backend checks at import, `plans` before it builds, and the
install scripts run `python -m edged.backends.tensorrt_version` (TensorRT and pycuda, one line).
"""

from __future__ import annotations

import re
import sys

from edged.backends.base import EngineError

MINIMUM = (10, 3)
NEEDED = "TensorRT >= 10.3 (JetPack 6.1 or later)"


def refusal(version: str) -> str | None:
    """Why TensorRT `version` (tensorrt.__version__, e.g. "10.3.0.30") cannot run edged, or None."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) < MINIMUM:
        return f"TensorRT {version} found; edged needs {NEEDED}"
    return None


def check(version: str) -> None:
    """EngineError naming the version found and the one needed, unless it is new enough."""
    reason = refusal(version)
    if reason is not None:
        raise EngineError(reason)


def main() -> int:
    """The install scripts' check: TensorRT's bindings import and are new enough, and pycuda imports."""
    try:
        import tensorrt
    except ImportError as exc:
        print(f"no TensorRT Python bindings ({exc}); edged needs {NEEDED}: apt-get install python3-libnvinfer, "
              f"in a venv made with --system-site-packages", file=sys.stderr)
        return 1
    reason = refusal(tensorrt.__version__)
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as exc:
        print(f"TensorRT {tensorrt.__version__} found, pycuda not ({exc}); edged needs pycuda built against this "
              f"CUDA (scripts/install-jetson.sh builds it)", file=sys.stderr)
        return 1
    print(f"TensorRT {tensorrt.__version__} and pycuda: the tensorrt backend can load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
