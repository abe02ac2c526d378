"""Exporting torch modules to ONNX graphs the runtime can bind: one place for every family.

Graphs use the default (dynamo) exporter at opset 18: the legacy exporter cannot export the vocoder,
and newer opsets fuse attention into ops TensorRT may not accept. Dynamic dims are exported from
example sizes >= 2 (size 1 would specialise them) and checked afterwards.

A module built with fake tensors (engines.weights.fake) is exported from its shapes alone; each of
its weights is made when the graph's data is written (`weights(name)`, one tensor at a time) and
streamed to `<graph>.onnx.data`, so a graph is never whole in memory. A weight the graph reads
transposed (a Linear's) is transposed as it is made, not folded into a second copy. A graph whose
weights are small (below INLINE_BYTES) is kept one self-contained file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx import numpy_helper
from torch._subclasses.fake_tensor import FakeTensor

OPSET = 18
INLINE_BYTES = 256 << 20
"""Graphs whose weights are smaller are written as one file; larger ones keep `<name>.data` beside."""


def export_graph(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
                 dynamic: tuple, weights: Callable[[str], torch.Tensor] | None = None) -> dict:
    """Export `module(*args)` to `path` with these tensor names; `weights(name)` makes each fake
    tensor of the module (by its state-dict name). Returns the manifest's tensor lists."""
    program = torch.onnx.export(
        module.eval(), args, dynamo=True, opset_version=OPSET, input_names=inputs, output_names=outputs,
        dynamic_shapes=dynamic, optimize=False, verbose=False,
    )
    assert program is not None
    defer_weights(program.model, weights)
    program.optimize()
    save_program(program, path)
    model = onnx.load(str(path), load_external_data=False)
    got = [i.name for i in model.graph.input]
    if got != inputs:
        raise RuntimeError(f"{path.name}: exported inputs {got}, expected {inputs}")
    check_dynamic(model, path.name, dynamic)
    return {"inputs": inputs, "outputs": outputs}


def defer_weights(model: ir.Model, weights: Callable[[str], torch.Tensor] | None) -> None:
    """Fake initializers become tensors made by `weights` when written; a 2-D initializer read only
    through a Transpose becomes its transpose, made when written (the optimizer would fold it into a
    copy held in memory)."""
    graph = model.graph
    for name, value in graph.initializers.items():
        if isinstance(value.const_value.raw, FakeTensor):
            if weights is None:
                raise ValueError(f"{name}: a fake weight and nothing to make it from")
            value.const_value = _lazy(name, value.const_value, lambda name=name: weights(name).numpy())
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" else None
        if source is None or not source.is_initializer() or len(source.uses()) != 1 or len(source.shape) != 2:
            continue
        perm = node.attributes.get("perm")
        if perm is not None and list(perm.as_ints()) != [1, 0]:
            continue
        tensor = source.const_value
        transposed = ir.Value(name=f"{source.name}.T", shape=ir.Shape([source.shape[1], source.shape[0]]),
                              type=source.type, const_value=_lazy(f"{source.name}.T", tensor,
                                                                  lambda t=tensor: np.ascontiguousarray(t.numpy().T),
                                                                  transposed=True))
        graph.register_initializer(transposed)
        node.outputs[0].replace_all_uses_with(transposed)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)


def _lazy(name: str, like, make: Callable[[], np.ndarray], transposed: bool = False) -> ir.LazyTensor:
    dims = list(like.shape)[::-1] if transposed else list(like.shape)
    return ir.LazyTensor(lambda: ir.Tensor(make()), dtype=like.dtype, shape=ir.Shape(dims), name=name)


def save_program(program: torch.onnx.ONNXProgram, path: Path, external_data: bool | None = None) -> None:
    """Save an exported program without the exporter's per-node provenance (source lines and the
    addresses of Python functions), so the same module exports to the same bytes. Weights stream to
    `<name>.data` unless they are small (or `external_data` says otherwise)."""
    model = program.model
    for node in model.graph.all_nodes():
        node.metadata_props.clear()
    if external_data is None:
        external_data = sum(v.const_value.nbytes for v in model.graph.initializers.values()) >= INLINE_BYTES
    data = path.with_name(path.name + ".data")
    if data.exists():
        data.unlink()
    ir.save(model, path, external_data=data.name if external_data else None)


def read_initializer(init: onnx.TensorProto, base: Path) -> np.ndarray:
    """An initializer's values; external data is read alone from its file under `base` (a graph
    loaded with load_external_data=False is rewritten one tensor at a time)."""
    return numpy_helper.to_array(_inline(init, base) if _external(init) else init)


def save_streamed(model: onnx.ModelProto, path: Path, base: Path) -> None:
    """Write `model` to `path`, its initializers' data to `<name>.data` one tensor at a time (those in
    memory moved out, those still external copied from their file under `base`, which may be the
    file being replaced); a graph whose weights are small (below INLINE_BYTES) becomes one file."""
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
    return onnx.TensorProto(name=init.name, dims=init.dims, data_type=init.data_type,
                            raw_data=_external_bytes(init, base))


def _raw(init: onnx.TensorProto) -> bytes:
    """An in-memory initializer's bytes as raw_data stores them (typed fields encoded)."""
    return init.raw_data or numpy_helper.from_array(numpy_helper.to_array(init)).raw_data


def check_dynamic(model: onnx.ModelProto, name: str, dynamic: tuple) -> None:
    """The exporter silently specialises a dim it could not keep dynamic: check every input."""
    flat: list = []
    for item in dynamic:
        flat.extend(item) if isinstance(item, (tuple, list)) else flat.append(item)
    for spec, value in zip(flat, model.graph.input):
        for axis in (spec or {}):
            dim = value.type.tensor_type.shape.dim[axis]
            if dim.HasField("dim_value"):
                raise RuntimeError(f"{name}: input {value.name} axis {axis} was exported static ({dim.dim_value})")
