"""TensorRT optimization profiles (engines/tensorrt.py), computed without TensorRT from the ONNX
graphs: every dynamic axis of every input gets a role, and the ranges cover what the runtime binds."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

from edged.artifact import load_artifact
from engines.tensorrt import profile, sizes


def inputs(path) -> list[tuple[str, list[int]]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(i.name, [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim])
            for i in graph.input]


def test_every_dynamic_axis_has_a_range_covering_the_bindings(builtin_artifact):
    a = load_artifact(builtin_artifact)
    by_role = sizes({"max_batch": a.max_batch, "max_seq": a.max_seq}, chunk_frames=4, first_chunk_frames=6)
    seen_dynamic = 0
    for role in a.graphs:
        for name, shape in inputs(a.file(role)):
            shapes = profile(role, name, shape, by_role)
            if shapes is None:
                assert all(d >= 0 for d in shape)
                continue
            seen_dynamic += 1
            lo, opt, hi = shapes
            assert all(lo[i] <= opt[i] <= hi[i] for i in range(len(shape))), (role, name)
            for axis, d in enumerate(shape):
                if d >= 0:
                    assert lo[axis] == hi[axis] == d
                elif role == "talker_prefill":  # one request's prefill: 1..max_seq rows
                    assert (lo[axis], hi[axis]) == (1, a.max_seq), (role, name, axis)
                elif role == "vocoder" and name == "codes" and axis == 2:  # the window's new frames
                    assert (lo[axis], opt[axis], hi[axis]) == (1, 4, 6)
                else:  # batch rows: the plans bind 1..max_batch, most often one
                    assert axis == 0 and (lo[axis], opt[axis], hi[axis]) == (1, 1, a.max_batch), (role, name, axis)
    assert seen_dynamic > 10


def test_a_dynamic_axis_without_a_role_is_an_error():
    by_role = sizes({"max_batch": 4, "max_seq": 64})
    with pytest.raises(ValueError, match="talker_prefill: input inputs_embeds axis 2 is dynamic"):
        profile("talker_prefill", "inputs_embeds", [1, -1, -1], by_role)
    with pytest.raises(ValueError, match="speaker_encoder: engines/tensorrt.py DYNAMIC has no entry"):
        profile("speaker_encoder", "pcm", [-1, -1], by_role)
