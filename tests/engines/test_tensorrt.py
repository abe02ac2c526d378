"""TensorRT optimization profiles (engines/tensorrt.py), computed without TensorRT from the ONNX
graphs: every dynamic axis of every input of every graph the TensorRT backend loads gets a role, and
the ranges cover what the runtime binds; the clone encoder's graphs get none (ONNX Runtime runs them)."""

from __future__ import annotations

import json

import pytest

onnx = pytest.importorskip("onnx")

from edged.artifact import load_artifact
from engines.tensorrt import ON_ONNX_RUNTIME, profile, profiles, sizes, tensorrt_roles


def inputs(path) -> list[tuple[str, list[int]]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(i.name, [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim])
            for i in graph.input]


def test_every_dynamic_axis_has_a_range_covering_the_bindings(builtin_artifact):
    a = load_artifact(builtin_artifact)
    by_role = sizes({"max_batch": a.max_batch, "max_seq": a.max_seq}, a.dims.code_groups, chunk_frames=4,
                    first_chunk_frames=6)
    seen_dynamic = 0
    roles = tensorrt_roles(json.loads((builtin_artifact / "artifact.json").read_text()))
    assert set(roles) == set(a.graphs) - set(ON_ONNX_RUNTIME) and set(ON_ONNX_RUNTIME) <= set(a.graphs)
    for role in roles:
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
    code-predictor pass 1..max_batch members x 1..8 rows (up to 8 verified) over code-groups slots; a
    draft 1..7 groups."""
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
    g = a.dims.code_groups
    verified, drafted = (1, 1, min(8, g - 1)), (1, 1, max(1, min(7, g - 2)))
    if role == "code_predictor" and name == "heads":  # the verified rows' heads
        return verified
    if role == "code_predictor" and axis > 0:  # a pass's rows (2 in a frame's first), its verified rows, its cache
        if name == "inputs_embeds":
            return (1, 1, max(2, min(8, g - 1)))
        return verified if name in ("drafts", "draft_probs", "accept_noise", "noise") else (g,) * 3
    if role == "code_predictor_draft" and (name == "heads" or axis > 0):  # the drafted groups
        return drafted
    assert axis == 0
    return batch


def test_the_talker_is_one_engine_with_a_context_and_a_generation_profile():
    assert len(profiles("talker")) == 2
    assert len(profiles("code_predictor")) == len(profiles("code_predictor_draft")) == len(profiles("vocoder")) == 1


def test_a_dynamic_axis_without_a_size_is_an_error():
    by_role = sizes({"max_batch": 4, "max_seq": 64}, 16)
    with pytest.raises(ValueError, match="talker: input inputs_embeds axis 2 is dynamic"):
        profile("talker", 0, "inputs_embeds", [1, -1, -1], by_role)
    with pytest.raises(ValueError, match="thinker: engines/tensorrt.py PROFILES has no entry"):
        profile("thinker", 0, "pcm", [-1, -1], by_role)
