"""An ONNX graph's weights read and written one tensor at a time, without torch: the rewrites of an
exported artifact (engines/fp16.py, engines/quantize.py) load a graph without its external data and
touch each weight only when they rewrite it, so a graph larger than memory can be rewritten."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

INLINE_BYTES = 256 << 20
"""Graphs whose weights are smaller are written as one file; larger ones keep `<name>.data` beside."""

EXTERNAL_MIN_BYTES = 1024
"""In a graph with external data, smaller initializers stay in the graph: ONNX Runtime infers shapes
at load from constants (an Unsqueeze's axes, a Reshape's shape) and cannot read those from external
data ("Cannot parse data from external tensors"); onnx's own external save keeps the same 1 KiB inline."""


def read_initializer(init: onnx.TensorProto, base: Path) -> np.ndarray:
    """An initializer's values; external data is read alone from its file under `base` (a graph
    loaded with load_external_data=False is rewritten one tensor at a time)."""
    return numpy_helper.to_array(_inline(init, base) if _external(init) else init)


def set_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """`graph`'s nodes become `nodes`, and its initializers the ones some node reads."""
    used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    graph.ClearField("node")
    graph.node.extend(nodes)


def rewrite_file(path: Path, out: Path, rewrite: Callable[[onnx.ModelProto, Path], dict[str, int]]) -> dict[str, int]:
    """Load the graph file at `path` without its external data, `rewrite(model, path's directory)` it
    in place (reading each weight it touches from there), write it to `out` (which may be `path`);
    returns what `rewrite` counted."""
    model = onnx.load(str(path), load_external_data=False)
    stats = rewrite(model, Path(path).parent)
    save_streamed(model, Path(out), Path(path).parent)
    return stats


def save_streamed(model: onnx.ModelProto, path: Path, base: Path) -> None:
    """Write `model` to `path`, its initializers' data to `<name>.data` one tensor at a time (those in
    memory moved out, those still external copied from their file under `base`, which may be the
    file being replaced); a graph whose weights are small (below INLINE_BYTES) becomes one file, and
    initializers under EXTERNAL_MIN_BYTES stay in the graph."""
    inits = list(model.graph.initializer)
    data = path.with_name(path.name + ".data")
    if sum(int(_where(i)["length"]) if _external(i) else len(i.raw_data) for i in inits) < INLINE_BYTES:
        for init in inits:
            if _external(init):
                init.CopyFrom(_inline(init, base))
        onnx.save_model(model, str(path))
        data.unlink(missing_ok=True)
        return
    staging = data.with_name(data.name + ".partial")
    with open(staging, "wb") as out:
        for init in inits:
            raw = _external_bytes(init, base) if _external(init) else _raw(init)
            if len(raw) < EXTERNAL_MIN_BYTES:
                init.CopyFrom(_with_raw(init, raw))
                continue
            offset = out.tell()
            out.write(raw)
            moved = onnx.TensorProto(name=init.name, dims=init.dims, data_type=init.data_type,
                                     data_location=onnx.TensorProto.EXTERNAL)
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(len(raw)))):
                moved.external_data.add(key=key, value=value)
            init.CopyFrom(moved)
    staging.replace(data)
    onnx.save_model(model, str(path))


def _external(init: onnx.TensorProto) -> bool:
    return init.data_location == onnx.TensorProto.EXTERNAL


def _where(init: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in init.external_data}


def _external_bytes(init: onnx.TensorProto, base: Path) -> bytes:
    where = _where(init)
    with open(base / where["location"], "rb") as f:
        f.seek(int(where.get("offset", 0)))
        return f.read(int(where["length"]))


def _inline(init: onnx.TensorProto, base: Path) -> onnx.TensorProto:
    """The initializer with its external bytes in raw_data."""
    return _with_raw(init, _external_bytes(init, base))


def _with_raw(init: onnx.TensorProto, raw: bytes) -> onnx.TensorProto:
    """The initializer held in the graph, as `raw` bytes."""
    return onnx.TensorProto(name=init.name, dims=init.dims, data_type=init.data_type, raw_data=raw)


def _raw(init: onnx.TensorProto) -> bytes:
    """An in-memory initializer's bytes as raw_data stores them (typed fields encoded)."""
    return init.raw_data or numpy_helper.from_array(numpy_helper.to_array(init)).raw_data
