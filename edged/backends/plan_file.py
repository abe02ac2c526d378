"""TensorRT plan files, stamped: which TensorRT built them, from which ONNX graph.

A serialized engine runs only on the TensorRT version (and GPU) that built it, and only means what
the ONNX graph it was built from meant, its external weights (`<graph>.onnx.data`, the one name
edged-engines writes) included. `<graph>.plan` therefore starts with one JSON header line: the
TensorRT version, what the plan was built from (each file's size and modification time) and the
SHA-256 of the ONNX file and its data, computed when the plan was built; then the engine bytes. The
header line is padded with spaces so the engine starts at a multiple of 4096 bytes (a page: NVIDIA's
own mmap loader aligns the same way). `edged-engines plans` writes it (the engine streamed from
TensorRT's buffer, never copied whole, into a temporary file renamed into place); the backend maps
it (`open_plan`) and hands TensorRT a view of the mapping: a 1.7 GB plan costs no host copy, which on
an Orin is DRAM the GPU shares.

At boot `open_plan` compares the files' sizes and modification times with the stamp and reads no byte
of the weights: hashing them would read the model's bytes a second time (40-80 s from an Orin Nano's
microSD). A plan whose stamp does not match (another TensorRT, a changed or replaced file, an
unaligned old-format plan) is refused, with the command that rebuilds it. `verify_plan` re-hashes the
files against the stamp's SHA-256 on request (`edged-engines plans --verify`). This module needs no
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
ALIGN = 4096
"""The engine's offset in the file is a multiple of this (a page)."""
MAX_HEADER = 1 << 16


def sources(onnx_path: Path) -> list[Path]:
    """The files a graph is: the ONNX file, and its external data when it has any."""
    data = onnx_path.with_name(onnx_path.name + ".data")
    return [onnx_path, data] if data.is_file() else [onnx_path]


def onnx_sha256(onnx_path: Path) -> str:
    """The SHA-256 of the graph file, and of its external data after it when it has any."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    for i, path in enumerate(sources(onnx_path)):
        if i:
            digest.update(b"\0external data\0")
        with open(path, "rb") as f:
            while n := f.readinto(buffer):
                digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()


def file_stamps(onnx_path: Path) -> list[dict]:
    """Name, size and modification time (ns) of each source file: what the boot compares. Inode and
    ctime are left out: a copy of the artifact with its plans (cp -a, rsync -a) keeps sizes and times
    but not those, and is still what the plans were built from."""
    stamps = []
    for path in sources(onnx_path):
        st = path.stat()
        stamps.append({"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return stamps


def write_plan(plan_path: Path, engine, tensorrt_version: str, onnx_path: Path, **extra: object) -> None:
    """The header (padded so the engine starts on a page), then `engine` (any buffer: TensorRT's
    IHostMemory) streamed as it is."""
    built_from = file_stamps(onnx_path)
    header = {"magic": MAGIC, "tensorrt": tensorrt_version, "onnx": onnx_path.name, "built_from": built_from,
              "onnx_sha256": onnx_sha256(onnx_path), **extra}
    if file_stamps(onnx_path) != built_from:
        raise EngineError(f"{onnx_path.name}: changed while its plan was built; build again")
    line = json.dumps(header).encode()
    offset = -(-(len(line) + 1) // ALIGN) * ALIGN
    if offset > MAX_HEADER:
        raise ValueError(f"{plan_path.name}: a plan header of {len(line)} bytes is too long")
    partial = plan_path.with_name(plan_path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(line.ljust(offset - 1) + b"\n")
        f.write(memoryview(engine))
    os.replace(partial, plan_path)


def changed(onnx_path: Path, built_from: list[dict]) -> str | None:
    """What differs between the graph's files now and the stamp (sizes, times, which files), or None.
    Reads no file: only their metadata."""
    now = {s["file"]: s for s in file_stamps(onnx_path)}
    then = {str(s.get("file")): s for s in built_from if isinstance(s, dict)}
    for name in sorted(now.keys() | then.keys()):
        if name not in then:
            return f"{name} was not there when it was built"
        if name not in now:
            return f"{name} is gone"
        if now[name]["size"] != then[name].get("size"):
            return f"{name} is {now[name]['size']} bytes, was {then[name].get('size')}"
        if now[name]["mtime_ns"] != then[name].get("mtime_ns"):
            return f"{name} was modified after the plan was built"
    return None


def read_header(mapped: mmap.mmap, name: str) -> tuple[dict, int]:
    """The header of a mapped plan and where its engine starts; EngineError for anything else."""
    end = mapped.find(b"\n", 0, MAX_HEADER)
    try:
        header = json.loads(mapped[:end]) if end > 0 else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise EngineError(f"{name}: not a plan written by edged-engines plans ({REBUILD})")
    if (end + 1) % ALIGN or "built_from" not in header:
        raise EngineError(f"{name}: an old-format plan (its engine is not page-aligned, or it has no stamp of what "
                          f"it was built from) ({REBUILD})")
    return header, end + 1


@contextmanager
def open_plan(plan_path: Path, onnx_path: Path, tensorrt_version: str) -> Iterator[tuple[dict, memoryview]]:
    """The header and a view of the engine bytes (memory-mapped) of a plan built by this TensorRT from
    this ONNX graph (its files' sizes and times as stamped; their bytes are not read); the view is
    released on exit, so nothing may keep it."""
    if not plan_path.is_file():
        raise EngineError(f"{plan_path.name}: no TensorRT plan ({REBUILD})")
    with open(plan_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        header, start = read_header(mapped, plan_path.name)
        if header.get("tensorrt") != tensorrt_version:
            raise EngineError(f"{plan_path.name}: built by TensorRT {header.get('tensorrt')}, this is TensorRT "
                              f"{tensorrt_version} ({REBUILD})")
        difference = changed(onnx_path, header["built_from"])
        if difference:
            raise EngineError(f"{plan_path.name}: built from another {onnx_path.name} (or its external data) than the "
                              f"artifact's: {difference} ({REBUILD})")
        with memoryview(mapped) as whole, whole[start:] as engine:
            yield header, engine


def verify_plan(plan_path: Path, onnx_path: Path) -> str | None:
    """Why the plan is not what its graph's files hash to now (re-reading them whole), or None: the
    check the boot leaves out."""
    if not plan_path.is_file():
        return "no TensorRT plan"
    with open(plan_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        try:
            header, _ = read_header(mapped, plan_path.name)
        except EngineError as exc:
            return str(exc).split(": ", 1)[1]
    if header.get("onnx_sha256") != onnx_sha256(onnx_path):
        return f"built from other bytes than {onnx_path.name} (or its external data) now holds ({REBUILD})"
    difference = changed(onnx_path, header["built_from"])
    if difference:
        return f"the same bytes, but {difference}: the boot refuses it ({REBUILD})"
    return None
