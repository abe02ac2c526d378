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
from torch._subclasses.fake_tensor import FakeTensor

from engines.onnx_data import INLINE_BYTES

OPSET = 18
HELD_BYTES = 16 << 20
"""A weight this large made in memory (not streamed) by the export is an error: it would grow with
the model."""


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
    held = [f"{name} ({v.const_value.nbytes >> 20} MiB)" for name, v in program.model.graph.initializers.items()
            if not isinstance(v.const_value, ir.LazyTensor) and v.const_value.nbytes > HELD_BYTES]
    if weights is not None and held:  # the optimizer folded a weight into a copy in memory
        raise RuntimeError(f"{path.name}: weights held in memory instead of streamed: {', '.join(held)}")
    save_program(program, path)
    model = onnx.load(str(path), load_external_data=False)
    got = [i.name for i in model.graph.input]
    if got != inputs:
        raise RuntimeError(f"{path.name}: exported inputs {got}, expected {inputs}")
    check_dynamic(model, path.name, dynamic)
    return {"inputs": inputs, "outputs": outputs}


def defer_weights(model: ir.Model, weights: Callable[[str], torch.Tensor] | None) -> None:
    """Fake initializers become tensors made by `weights` when written; an initializer read only
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
        if source is None or not source.is_initializer() or len(source.uses()) != 1:
            continue
        attribute = node.attributes.get("perm")
        perm = list(attribute.as_ints()) if attribute is not None else list(range(len(source.shape)))[::-1]
        tensor = source.const_value
        made = lambda t=tensor, perm=perm: np.ascontiguousarray(t.numpy().transpose(perm))  # noqa: E731
        transposed = ir.Value(name=f"{source.name}.T", shape=ir.Shape([source.shape[i] for i in perm]),
                              type=source.type, const_value=_lazy(f"{source.name}.T", tensor, made, perm))
        graph.register_initializer(transposed)
        node.outputs[0].replace_all_uses_with(transposed)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)


def _lazy(name: str, like, make: Callable[[], np.ndarray], perm: list[int] | None = None) -> ir.LazyTensor:
    dims = list(like.shape) if perm is None else [like.shape[i] for i in perm]
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
