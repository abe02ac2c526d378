"""TensorRT plan files, stamped: which TensorRT built them, from which ONNX graph.

A serialized engine runs only on the TensorRT version (and GPU) that built it, and only means what
the ONNX graph it was built from meant, its external weights (`<graph>.onnx.data`, the one name
edged-engines writes) included. `<graph>.plan` therefore starts with one JSON header line: the
TensorRT version and the SHA-256 of the ONNX file and its data, then the engine bytes.
`edged-engines plans` writes it (the engine streamed from TensorRT's buffer, never copied whole,
into a temporary file renamed into place); the backend maps it (`open_plan`) and hands TensorRT a
view of the mapping: a 1.7 GB plan costs no host copy, which on an Orin is DRAM the GPU shares. A
plan whose stamp does not match is refused, with the command that rebuilds it. This module needs no
TensorRT.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edged.backends.base import EngineError

MAGIC = "edged-tensorrt-plan"
REBUILD = "rebuild the plans on this device: edged-engines plans ARTIFACT"
CHUNK = 1 << 20


def onnx_sha256(onnx_path: Path) -> str:
    """The SHA-256 of the graph file, and of its external data after it when it has any."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    data = onnx_path.with_name(onnx_path.name + ".data")
    for i, path in enumerate((onnx_path, data) if data.is_file() else (onnx_path,)):
        if i:
            digest.update(b"\0external data\0")
        with open(path, "rb") as f:
            while n := f.readinto(buffer):
                digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()


def write_plan(plan_path: Path, engine, tensorrt_version: str, onnx_path: Path, **extra: object) -> None:
    """The header, then `engine` (any buffer: TensorRT's IHostMemory) streamed as it is."""
    header = {"magic": MAGIC, "tensorrt": tensorrt_version, "onnx": onnx_path.name,
              "onnx_sha256": onnx_sha256(onnx_path), **extra}
    partial = plan_path.with_name(plan_path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.write(memoryview(engine))
    os.replace(partial, plan_path)


@contextmanager
def open_plan(plan_path: Path, onnx_path: Path, tensorrt_version: str) -> Iterator[tuple[dict, memoryview]]:
    """The header and a view of the engine bytes (memory-mapped) of a plan built by this TensorRT from
    this ONNX graph; the view is released on exit, so nothing may keep it."""
    if not plan_path.is_file():
        raise EngineError(f"{plan_path.name}: no TensorRT plan ({REBUILD})")
    with open(plan_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        end = mapped.find(b"\n", 0, 1 << 16)
        try:
            header = json.loads(mapped[:end]) if end > 0 else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("magic") != MAGIC:
            raise EngineError(f"{plan_path.name}: not a plan written by edged-engines plans ({REBUILD})")
        if header.get("tensorrt") != tensorrt_version:
            raise EngineError(f"{plan_path.name}: built by TensorRT {header.get('tensorrt')}, this is TensorRT "
                              f"{tensorrt_version} ({REBUILD})")
        if header.get("onnx_sha256") != onnx_sha256(onnx_path):
            raise EngineError(f"{plan_path.name}: built from another {onnx_path.name} (or its external data) than the "
                              f"artifact's ({REBUILD})")
        with memoryview(mapped) as whole, whole[end + 1:] as engine:
            yield header, engine
