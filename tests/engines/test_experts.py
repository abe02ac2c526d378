"""Qwen3-Omni's experts in smaller forms (engines/experts.py): each stack is read only by a Gather on
its experts' axis, so a step reads only the experts it routes to; the int8 and int4 forms compute
exactly what the fp32 graph computes from the same quantized values (the 4-bit codes packed two to a
byte and unpacked in the graph); the fp16 form stores the stacks fp16 and keeps the talker's hidden
states within a few parts in a thousand."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, numpy_helper

from engines.cli import main as engines_main
from engines.experts import gathered_stacks, quantize_stacks
from engines.fp16 import convert_artifact
from engines.quantize import EXPERTS_REFUSAL, dequantize, quantize_artifact, quantize_block
from engines.weight_form import FormError

BLOCK = 16  # the tiny experts are 16 wide


@pytest.fixture(scope="module")
def omni(omni_artifacts):
    """A tiny Qwen3-Omni artifact (variant 1: 3 layers of 8 experts, top 3), the session's: read only."""
    return omni_artifacts(1, 21)[1]


def talker_feeds(model: onnx.ModelProto, batch: int, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    slots, vocab = 8, dims["seen"][1]
    feeds = {"inputs_embeds": rng.standard_normal((batch, rows, dims["inputs_embeds"][2]), dtype=np.float32),
             "positions": np.full(batch, 3, np.int64), "slots": np.zeros(slots, np.int64),
             "seen": np.zeros((batch, vocab), np.float32), "repetition_penalty": np.ones(batch, np.float32),
             "allow_eos": np.ones(batch, bool), "temperature": np.zeros(batch, np.float32),
             "top_k": np.zeros(batch, np.int64), "top_p": np.ones(batch, np.float32),
             "noise": rng.random((batch, vocab), dtype=np.float32)}
    kinds = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    for name, shape in dims.items():
        if name.startswith("past_"):
            keys = name.startswith("past_keys")
            shape = [batch, shape[1], shape[2], slots] if keys else [batch, shape[1], slots, shape[3]]
            cache = rng.standard_normal(shape, dtype=np.float32)  # an fp16 network's cache is fp16
            feeds[name] = cache.astype(np.float16) if kinds[name] == TensorProto.FLOAT16 else cache
    return feeds


def hidden(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["hidden"], feeds)[0]


@pytest.mark.parametrize("bits", [8, 4])
def test_gathered_quantized_experts_compute_what_their_dequantized_values_do(omni, bits):
    """The talker with its stacks quantized equals the fp32 talker whose stacks hold the dequantized
    values, for a prefill (every expert) and a batched decode step (a few)."""
    source = onnx.load(str(omni / "talker.onnx"))
    stacks = {init.name: numpy_helper.to_array(init) for _, init in gathered_stacks(source.graph).values()}
    assert len(stacks) == 3 * 3  # gate, up and down of 3 layers
    quantized = onnx.load(str(omni / "talker.onnx"))
    counts = quantize_stacks(quantized, bits, BLOCK, lambda w: quantize_block(w, bits, BLOCK))
    assert counts == {"gathered stacks": 9, "gathered parameters": sum(s.size for s in stacks.values())}
    for opset in quantized.opset_import:
        opset.version = max(opset.version, 21)
    quantized.ir_version = max(quantized.ir_version, 10)
    reference = onnx.load(str(omni / "talker.onnx"))
    for init in reference.graph.initializer:
        if init.name in stacks:
            w = stacks[init.name]
            e, k, n = w.shape
            q, scale = quantize_block(w.reshape(e * k, n), bits, BLOCK)
            init.CopyFrom(numpy_helper.from_array(dequantize(q, scale, BLOCK).reshape(w.shape), init.name))
    for batch, rows in ((1, 6), (2, 1)):
        feeds = talker_feeds(source, batch, rows, seed=batch)
        got, want = hidden(quantized, feeds), hidden(reference, feeds)
        assert np.abs(got - want).max() < 1e-5 and np.abs(got - hidden(source, feeds)).max() > 0  # quantized


@pytest.mark.parametrize("form", ["fp16", "int8", "int4"])
def test_a_step_reads_only_the_experts_it_gathers(omni, form, tmp_path):
    out = tmp_path / form
    convert_artifact(omni, out) if form == "fp16" else quantize_artifact(omni, out, form, block=BLOCK)
    graph = onnx.load(str(out / "talker.onnx")).graph
    kinds = {"fp16": {TensorProto.FLOAT16}, "int8": {TensorProto.INT8, TensorProto.FLOAT},
             "int4": {TensorProto.UINT8, TensorProto.FLOAT}}[form]
    stacks = [i for i in graph.initializer if len(i.dims) == 3]
    assert len(stacks) == {"fp16": 9, "int8": 18, "int4": 18}[form]  # values (and scales) of 9 stacks
    for init in stacks:
        readers = [n for n in graph.node if init.name in n.input]
        assert init.data_type in kinds and [n.op_type for n in readers] == ["Gather"], init.name
        assert next((a.i for a in readers[0].attribute if a.name == "axis"), 0) == 0
    source = onnx.load(str(omni / "talker.onnx"), load_external_data=False).graph
    parameters = sum(int(np.prod(i.dims)) for i in source.initializer if len(i.dims) == 3)
    values = sum(int(np.prod(i.dims)) for i in stacks if i.data_type != TensorProto.FLOAT)
    assert values == (parameters // 2 if form == "int4" else parameters)  # int4: two codes a byte


def test_the_fp16_talker_keeps_the_fp32_talkers_hidden_states(omni, tmp_path):
    """fp16 stacks (and products) move a prefill's and a decode step's hidden state by a few parts
    in a thousand of its scale."""
    convert_artifact(omni, tmp_path / "fp16")
    half = onnx.load(str(tmp_path / "fp16" / "talker.onnx"))
    assert all(i.data_type == TensorProto.FLOAT16 for i in half.graph.initializer if len(i.dims) == 3)
    source = onnx.load(str(omni / "talker.onnx"))
    for batch, rows in ((1, 6), (2, 1)):
        feeds = talker_feeds(half, batch, rows, seed=10 + batch)
        got = hidden(half, feeds)
        want = hidden(source, {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()})
        assert 0 < np.abs(got - want).max() < 1e-2 * np.abs(want).max(), np.abs(got - want).max()


def test_gathered_experts_are_refused_for_jetson_before_anything_is_written(omni_artifacts, omni, tmp_path, capsys):
    """TensorRT 10.3 parses no gathered INT4 form (a zero point of 8, BitwiseAnd / BitShift unpacking):
    `quantize --target jetson` and `export --weights int4 --target jetson` of a Qwen3-Omni
    checkpoint stop with the one-line reason and leave no output directory."""
    with pytest.raises(FormError, match="gathered experts \\(Qwen3-Omni\\) have no Jetson form"):
        quantize_artifact(omni, tmp_path / "q", "int4", "jetson")
    convert_artifact(omni, tmp_path / "fp16")
    with pytest.raises(SystemExit, match=f"^edged-engines: {EXPERTS_REFUSAL.replace('(', '.').replace(')', '.')}$"):
        engines_main(["quantize", "--artifact", str(tmp_path / "fp16"), "--out", str(tmp_path / "cli"), "--weights",
                      "int4", "--target", "jetson"])
    with pytest.raises(SystemExit, match="^edged-engines: gathered experts"):
        engines_main(["export", "--checkpoint", str(omni_artifacts(1, 21)[0]), "--out", str(tmp_path / "export"),
                      "--weights", "int4", "--target", "jetson"])
    assert not any((tmp_path / name).exists() for name in ("q", "cli", "export"))
