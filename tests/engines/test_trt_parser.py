"""The building half of the TensorRT double (tests/support/fake_trt_build.py) as strict as onnx-tensorrt
10.x: tiny graphs each rule of its importer refuses are refused, with the importer's words; every
graph the TensorRT backend loads, of the built-in artifact and of its fp16 and Jetson int4 twins,
parses and builds under those rules; and the activation memory a plan records comes from the graph's
own intermediate tensors, not from its inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import fake_trt, fake_trt_build

OPSET = [helper.make_opsetid("", 21)]


def graph(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=OPSET)


def parse(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    network = fake_trt_build.Builder(fake_trt.Logger()).create_network(0)
    parser = fake_trt_build.OnnxParser(network, fake_trt.Logger())
    return [] if parser.parse_from_file(str(path)) else [str(parser.get_error(i)) for i in range(parser.num_errors)]


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def i64(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.INT64, shape)


def int4_weights(name, rows, cols) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT4, [rows, cols], np.zeros(rows * cols, np.int8).tolist())


@pytest.mark.parametrize("op, axes_at, want", [
    ("Squeeze", 1, "Squeeze axes input must be an initializer!"),
    ("Unsqueeze", 1, "Axes input for unsqueeze operation should be a constant tensor."),
    ("ReduceSum", 1, "Axis input must be an initializer!"),
    ("ReduceMean", 1, "Axis input must be an initializer!"),
])
def test_axes_computed_at_run_time_are_refused(tmp_path, op, axes_at, want):
    """onnxOpImporters.cpp (Squeeze, Unsqueeze) and importerUtils.cpp (reduceTensor) at release/10.1-GA;
    the same axes as an initializer parse."""
    node = helper.make_node(op, ["x", "axes"], ["y"], name="n")
    refused = graph([node], [f32("x", [1, 4]), i64("axes", [1])], [f32("y", None)])
    assert parse(refused, tmp_path) == [f"In node n ({op}): {want}"]
    constant = graph([node], [f32("x", [1, 4])], [f32("y", None)], [numpy_helper.from_array(np.array([0]), "axes")])
    assert parse(constant, tmp_path) == []


def test_slice_with_axes_computed_at_run_time_is_refused(tmp_path):
    consts = [numpy_helper.from_array(np.array([0]), n) for n in ("starts", "ends")]
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="s")
    model = graph([node], [f32("x", [4, 4]), i64("axes", [1])], [f32("y", None)], consts)
    assert parse(model, tmp_path) == ["In node s (Slice): This version of TensorRT does not support dynamic axes."]


def test_topk_unsorted_or_with_k_of_3840_is_refused(tmp_path):
    """docs/operators.md (release/10.1-GA), TopK: "`sorted` must be 1. `K` input must be less than 3840."""
    def topk(k: int, sorted_: int) -> onnx.ModelProto:
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="t", sorted=sorted_)
        return graph([node], [f32("x", [1, 4096])], [f32("v", None), i64("i", None)],
                     [numpy_helper.from_array(np.array([k]), "k")])

    assert parse(topk(50, 1), tmp_path) == []
    assert parse(topk(50, 0), tmp_path) == ["In node t (TopK): TopK: `sorted` must be 1"]
    assert parse(topk(3840, 1), tmp_path) == ["In node t (TopK): TopK: `K` input must be less than 3840"]


def test_a_dequantize_with_a_nonzero_zero_point_is_refused(tmp_path):
    """QuantDequantLinearHelper: "TensorRT only supports symmetric quantization" (the zero point of 8
    an unsigned INT4 form uses, or any other)."""
    def dq(zero: int) -> onnx.ModelProto:
        node = helper.make_node("DequantizeLinear", ["w", "scale", "zero"], ["wf"], name="dq", axis=0)
        mm = helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")
        return graph([node, mm], [f32("x", [1, 4])], [f32("y", None)],
                     [numpy_helper.from_array(np.ones((4, 4), np.int8), "w"),
                      numpy_helper.from_array(np.full(4, 0.5, np.float32), "scale"),
                      numpy_helper.from_array(np.full(4, zero, np.int8), "zero")])

    assert parse(dq(0), tmp_path) == []
    assert parse(dq(8), tmp_path) == ["In node dq (DequantizeLinear): TensorRT only supports symmetric quantization. "
                                      "The zero point for the QuantizeLinear/DequantizeLinear operator must be all "
                                      "zeros."]


def test_int4_with_an_odd_last_dimension_or_two_blocked_dimensions_is_refused(tmp_path):
    """QuantDequantLinearHelper: INT4 "with an odd last dimension" (two values to a byte), and a blocked
    scale blocking more than "a single blocking dimension"."""
    def dq(rows: int, cols: int, scale_shape: list[int]) -> onnx.ModelProto:
        node = helper.make_node("DequantizeLinear", ["w", "scale"], ["wf"], name="dq", axis=0, block_size=64)
        mm = helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")
        return graph([node, mm], [f32("x", [1, rows])], [f32("y", None)],
                     [int4_weights("w", rows, cols),
                      numpy_helper.from_array(np.ones(scale_shape, np.float16), "scale")])

    assert parse(dq(128, 64, [2, 64]), tmp_path) == []
    assert parse(dq(128, 63, [2, 63]), tmp_path) == [
        "In node dq (DequantizeLinear): Quantization to INT4 is not supported for tensors with an odd last dimension."]
    assert parse(dq(128, 64, [2, 32]), tmp_path) == [
        "In node dq (DequantizeLinear): Only a single blocking dimension is allowed."]


@pytest.fixture
def installed(monkeypatch):
    fake_trt.install(monkeypatch)


def test_every_tensorrt_graph_of_the_builtin_artifact_and_its_twins_builds_under_the_rules(installed, builtin_artifact,
                                                                                          tmp_path):
    """fp32, the fp16 twin (`edged-engines fp16`) and the int4 twin (`quantize --weights int4 --target
    jetson`): every graph the TensorRT backend loads parses with no importer refusal and builds, and
    no plan is written for the clone encoder."""
    from engines.fp16 import convert_artifact
    from engines.quantize import quantize_artifact
    from engines.tensorrt import build_plans

    fp32, fp16, int4 = tmp_path / "fp32", tmp_path / "fp16", tmp_path / "int4"
    shutil.copytree(builtin_artifact, fp32)
    convert_artifact(builtin_artifact, fp16)
    quantize_artifact(builtin_artifact, int4, "int4", "jetson")
    for art in (fp32, fp16, int4):
        for path in art.glob("*.onnx"):
            assert fake_trt_build.importer_refusals(onnx.load(str(path), load_external_data=False)) == [], path
        plans = build_plans(art)
        assert sorted(p.name for p in plans) == ["code_predictor.plan", "code_predictor_draft.plan", "talker.plan",
                                                 "vocoder.plan"], art
        assert not list(art.glob("*encoder.plan"))


def test_activation_memory_comes_from_the_graphs_intermediate_tensors(installed, tmp_path):
    """Two graphs with the same input and output: one makes a [1, 4096] intermediate, one a [1, 8]. The
    recorded activation memory is that tensor's (rounded to 256 bytes), whatever the inputs weigh; and
    a dynamic axis is sized at the profile's largest shape."""
    def engine(width: int):
        w1 = numpy_helper.from_array(np.ones((4, width), np.float32), "w1")
        w2 = numpy_helper.from_array(np.ones((width, 4), np.float32), "w2")
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["y"])]
        path = tmp_path / f"g{width}.onnx"
        onnx.save(graph(nodes, [f32("x", ["B", 4])], [f32("y", ["B", 4])], [w1, w2]), str(path))
        logger = fake_trt.Logger()
        builder = fake_trt_build.Builder(logger)
        network = builder.create_network(0)
        assert fake_trt_build.OnnxParser(network, logger).parse_from_file(str(path))
        config = builder.create_builder_config()
        config.max_aux_streams = 0  # as `plans` builds (auxiliary streams would double what is counted)
        for largest in (1, 3):
            profile = builder.create_optimization_profile()
            profile.set_shape("x", [1, 4], [1, 4], [largest, 4])
            config.add_optimization_profile(profile)
        return fake_trt.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(network, config))

    wide, narrow = engine(4096), engine(8)
    # h and r alive at once: 2 x B x width x 4 bytes
    assert [wide.get_device_memory_size_for_profile_v2(p) for p in (0, 1)] == [2 * 4096 * 4, 3 * 2 * 4096 * 4]
    assert [narrow.get_device_memory_size_for_profile_v2(p) for p in (0, 1)] == [256, 256]
    assert wide.device_memory_size_v2 == 3 * 2 * 4096 * 4
