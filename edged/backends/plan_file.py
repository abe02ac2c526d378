"""TensorRT plan files, stamped: which TensorRT built them, from which ONNX graph.

A serialized engine runs only on the TensorRT version (and GPU) that built it, and only means what
the ONNX graph it was built from meant. `<graph>.plan` therefore starts with one JSON header line:
the TensorRT version and the SHA-256 of the ONNX file, then the engine bytes. `edged-engines plans`
writes it; the backend refuses a plan whose stamp does not match, with the command that rebuilds it.
This module needs no TensorRT.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from edged.backends.base import EngineError

MAGIC = "edged-tensorrt-plan"
REBUILD = "rebuild the plans on this device: edged-engines plans ARTIFACT"


def onnx_sha256(onnx_path: Path) -> str:
    digest = hashlib.sha256()
    with open(onnx_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def write_plan(plan_path: Path, engine: bytes, tensorrt_version: str, onnx_path: Path, **extra: object) -> None:
    header = {"magic": MAGIC, "tensorrt": tensorrt_version, "onnx": onnx_path.name,
              "onnx_sha256": onnx_sha256(onnx_path), **extra}
    plan_path.write_bytes(json.dumps(header).encode() + b"\n" + engine)


def read_plan(plan_path: Path, onnx_path: Path, tensorrt_version: str) -> tuple[dict, bytes]:
    """The header and engine bytes of a plan built by this TensorRT from this ONNX graph."""
    if not plan_path.is_file():
        raise EngineError(f"{plan_path.name}: no TensorRT plan ({REBUILD})")
    data = plan_path.read_bytes()
    head, _, engine = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise EngineError(f"{plan_path.name}: not a plan written by edged-engines plans ({REBUILD})")
    if header.get("tensorrt") != tensorrt_version:
        raise EngineError(f"{plan_path.name}: built by TensorRT {header.get('tensorrt')}, this is TensorRT "
                          f"{tensorrt_version} ({REBUILD})")
    if header.get("onnx_sha256") != onnx_sha256(onnx_path):
        raise EngineError(f"{plan_path.name}: built from another {onnx_path.name} than the artifact's ({REBUILD})")
    return header, engine
