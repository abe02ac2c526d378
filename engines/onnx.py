"""Exporting torch modules to ONNX graphs the runtime can bind: one place for every family.

Graphs use the default (dynamo) exporter at opset 18: the legacy exporter cannot export the vocoder,
and newer opsets fuse attention into ops TensorRT may not accept. Dynamic dims are exported from
example sizes >= 2 (size 1 would specialise them) and checked afterwards; each graph is kept one
self-contained file when it fits under protobuf's 2 GiB.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

OPSET = 18


def export_graph(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
                 dynamic: tuple) -> dict:
    """Export `module(*args)` to `path` with these tensor names; returns the manifest's tensor lists."""
    program = torch.onnx.export(
        module.eval(), args, dynamo=True, opset_version=OPSET, input_names=inputs, output_names=outputs,
        dynamic_shapes=dynamic, optimize=True, verbose=False,
    )
    save_program(program, path)
    model = onnx.load(str(path), load_external_data=False)
    got = [i.name for i in model.graph.input]
    if got != inputs:
        raise RuntimeError(f"{path.name}: exported inputs {got}, expected {inputs}")
    check_dynamic(model, path.name, dynamic)
    inline_external_data(path)
    return {"inputs": inputs, "outputs": outputs}


def save_program(program: torch.onnx.ONNXProgram, path: Path, external_data: bool | None = None) -> None:
    """Save an exported program without the exporter's per-node provenance (source lines and the
    addresses of Python functions), so the same module exports to the same bytes."""
    for node in program.model.graph.all_nodes():
        node.metadata_props.clear()
    program.save(str(path), external_data=external_data)


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


def inline_external_data(path: Path) -> None:
    """Keep a graph one self-contained file when it fits under protobuf's 2 GiB."""
    data = path.with_name(path.name + ".data")
    if not data.exists():
        return
    if data.stat().st_size + path.stat().st_size >= 1_900_000_000:  # protobuf cannot even measure it
        return
    model = onnx.load(str(path), load_external_data=True)
    onnx.save_model(model, str(path), save_as_external_data=False)
    data.unlink()
