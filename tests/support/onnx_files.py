"""What a graph written with external data must look like (engines/onnx_data.py)."""

from __future__ import annotations

import onnx

import engines.onnx_data


def assert_split_at_the_threshold(model: onnx.ModelProto, role: str) -> None:
    """Weights of EXTERNAL_MIN_BYTES or more live in the data file; smaller constants (shapes and axes
    ONNX Runtime reads when it infers shapes at load) stay in the graph."""
    sizes = {i.name: (i.data_location == onnx.TensorProto.EXTERNAL,
                      int({e.key: e.value for e in i.external_data}.get("length", len(i.raw_data))))
             for i in model.graph.initializer}
    assert any(external for external, _ in sizes.values()), role
    assert all(external == (size >= engines.onnx_data.EXTERNAL_MIN_BYTES) for external, size in sizes.values()), role
