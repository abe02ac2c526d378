"""The fp16 twin of an artifact (engines/fp16.py): fp16 weights for the matrix products and
convolutions, fp32 everywhere else, typed explicitly in the graph; it runs on ONNX Runtime (CPU)
and speaks like the fp32 artifact."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.fp16 import convert_artifact

FP16_OPS = {"MatMul", "Conv", "ConvTranspose"}
TEXTS = ["Hello there, this is the half precision check.", "The quick brown fox jumps over the lazy dog.",
         "你好，这是一个测试。"]


@pytest.fixture(scope="module")
def fp16(builtin_artifact, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "art"
    convert_artifact(builtin_artifact, out)
    return out


def test_only_the_weights_products_are_fp16(fp16):
    """Norms, softmax, heads (logits), embeddings and the sampler stay fp32: every fp16 value is a
    weight of, or an activation cast for, a matrix product or convolution, and is cast back after."""
    artifact = load_artifact(fp16)
    assert artifact.precision == "fp16"
    for role in artifact.graphs:
        graph = onnx.load(str(artifact.file(role))).graph
        half_inits = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
        half = set(half_inits)
        for node in graph.node:
            to_half = node.op_type == "Cast" and node.attribute[0].i == onnx.TensorProto.FLOAT16
            if to_half or (node.op_type in FP16_OPS and any(i in half for i in node.input)):
                half |= set(node.output)
        consumers = {i: [n for n in graph.node if i in n.input] for i in half}
        for value, nodes in consumers.items():
            for node in nodes:
                assert node.op_type in FP16_OPS or (node.op_type == "Cast" and node.attribute[0].i == onnx.TensorProto.FLOAT), \
                    f"{role}: fp16 value {value} reaches {node.op_type}"
        assert half_inits or role == "code_predictor_draft", role  # the draft graph has no weights of its own
        for node in graph.node:  # the heads that make logits, and the embeddings, read fp32 weights
            if node.op_type in ("Gemm", "Gather"):
                assert not any(i in half_inits for i in node.input), f"{role}: {node.op_type} {node.name}"


def test_the_fp16_twin_speaks_like_fp32(builtin_artifact, fp16, backend):
    requests = [SpeechRequest(f"r{i}", t, voice="vivian", sampling=Sampling.greedy(), max_frames=60)
                for i, t in enumerate(TEXTS)]
    want = Synthesizer(load_artifact(builtin_artifact), backend).synthesize(requests)
    got = Synthesizer(load_artifact(fp16), backend).synthesize(requests)
    agree = np.mean([np.mean(np.all(w.frames == g.frames, axis=1)) for w, g in zip(want, got)])
    snr = min(10 * np.log10(np.sum(w.pcm ** 2) / np.sum((w.pcm - g.pcm) ** 2)) for w, g in zip(want, got))
    assert agree >= 0.95 and snr >= 30, (agree, snr)


def test_an_fp16_artifact_is_not_converted_twice(fp16, tmp_path):
    with pytest.raises(ValueError, match="already fp16"):
        convert_artifact(fp16, tmp_path / "again")


def test_graphs_with_external_data_convert_one_tensor_at_a_time_to_the_same_graphs(builtin_artifact, fp16, tmp_path,
                                                                                     monkeypatch):
    """A large graph keeps its weights in `<graph>.onnx.data`: converting reads and writes them one
    tensor at a time (engines.onnx_data.save_streamed), in place, to the graph an in-memory one gives."""
    import shutil

    import engines.onnx_data

    monkeypatch.setattr(engines.onnx_data, "INLINE_BYTES", 0)  # every graph keeps external data
    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    for graph in load_artifact(art).graphs.values():
        model = onnx.load(str(art / graph.file))
        onnx.save_model(model, str(art / graph.file), save_as_external_data=True, location=graph.file + ".data",
                        size_threshold=0)
    convert_artifact(art, art)
    for role, graph in load_artifact(art).graphs.items():
        streamed = onnx.load(str(art / graph.file), load_external_data=False)
        assert all(i.data_location == onnx.TensorProto.EXTERNAL for i in streamed.graph.initializer), role
        streamed = onnx.load(str(art / graph.file))
        whole = onnx.load(str(fp16 / graph.file))
        assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in whole.graph.node]
        assert {i.name: i.raw_data for i in streamed.graph.initializer} == \
            {i.name: onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(i)).raw_data for i in whole.graph.initializer}
