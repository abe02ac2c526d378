"""TensorRT optimization profiles (engines/tensorrt.py), computed without TensorRT from the ONNX
graphs: every dynamic axis of every input gets a role, and the ranges cover what the runtime binds."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

from edged.artifact import load_artifact
from engines.tensorrt import profile, profiles, sizes


def inputs(path) -> list[tuple[str, list[int]]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(i.name, [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim])
            for i in graph.input]


def test_every_dynamic_axis_has_a_range_covering_the_bindings(builtin_artifact):
    a = load_artifact(builtin_artifact)
    by_role = sizes({"max_batch": a.max_batch, "max_seq": a.max_seq}, a.dims.code_groups, chunk_frames=4,
                    first_chunk_frames=6)
    seen_dynamic = 0
    for role in a.graphs:
        for index in range(len(profiles(role))):
            for name, shape in inputs(a.file(role)):
                shapes = profile(role, index, name, shape, by_role)
                if shapes is None:
                    assert all(d >= 0 for d in shape)
                    continue
                seen_dynamic += 1
                lo, opt, hi = shapes
                assert all(lo[i] <= opt[i] <= hi[i] for i in range(len(shape))), (role, name)
                for axis, d in enumerate(shape):
                    want = (d, d, d) if d >= 0 else expected(role, index, name, axis, a)
                    assert (lo[axis], opt[axis], hi[axis]) == want, (role, index, name, axis)
    assert seen_dynamic > 10


def expected(role: str, index: int, name: str, axis: int, a) -> tuple[int, int, int]:
    """What the runtime binds: the talker's context profile is one request's prefill (1..max_seq rows
    over a one-slot cache), its generation profile 1..max_batch members x 1 row over max_seq slots; a
    code-predictor pass 1..max_batch members x 1..2 rows over code-groups slots."""
    batch = (1, 1, a.max_batch)
    if role == "talker":
        cache_axis = 3 if name.startswith("past_keys") else 2 if name.startswith("past_values") else None
        if index == 0:
            return (1, 64, a.max_seq) if (name, axis) == ("inputs_embeds", 1) else (1, 1, 1)
        if name == "slots":  # the attention span of a decode plan
            return (64, 64, a.max_seq)
        if axis == cache_axis:
            return (a.max_seq,) * 3
        return (1, 1, 1) if (name, axis) == ("inputs_embeds", 1) else batch
    if role == "vocoder" and name == "codes" and axis == 2:  # the window's new frames
        return (1, 4, 6)
    if role == "code_predictor" and axis > 0:  # a pass's 1 or 2 rows, its cache of one slot per code group
        return (1, 1, 2) if name == "inputs_embeds" else (a.dims.code_groups,) * 3
    assert axis == 0
    return batch


def test_the_talker_is_one_engine_with_a_context_and_a_generation_profile():
    assert len(profiles("talker")) == 2 and len(profiles("code_predictor")) == len(profiles("vocoder")) == 1


def test_a_dynamic_axis_without_a_size_is_an_error():
    by_role = sizes({"max_batch": 4, "max_seq": 64}, 16)
    with pytest.raises(ValueError, match="talker: input inputs_embeds axis 2 is dynamic"):
        profile("talker", 0, "inputs_embeds", [1, -1, -1], by_role)
    with pytest.raises(ValueError, match="speaker_encoder: engines/tensorrt.py PROFILES has no entry"):
        profile("speaker_encoder", 0, "pcm", [-1, -1], by_role)
