"""The fp16 twin of an artifact (engines/fp16.py): an fp16 network (fp16 activations, weights and KV
cache) with fp32 islands (norms, softmax, heads, sampler), typed explicitly in the graph; it runs on
ONNX Runtime (CPU) and decides like the fp32 artifact, teacher-forced."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import onnxruntime as ort

from edged.artifact import load_artifact
from engines.fp16 import convert_artifact

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import quant_quality
from support.onnx_files import assert_split_at_the_threshold

ISLAND_OPS = {"Softmax", "ReduceMean", "ReduceSum", "ReduceLogSumExp", "LayerNormalization", "Gemm", "TopK", "Log",
              "Exp", "Sqrt"}
FRAMES = 48
LOGIT_BOUND = 0.1
"""fp16 against fp32, teacher-forced, any logit of code 0 or a group: 6.0e-2 at worst here over 576
decisions with fp16 activations and KV cache (2.5e-2 when only the products were fp16); weights 1 %
off give 1.3."""
SNR_DB = 30
TEXTS = ["Hello there, this is the half precision check.", "The quick brown fox jumps over the lazy dog.",
         "你好，这是一个测试。"]


@pytest.fixture(scope="module")
def fp16(builtin_artifact, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "art"
    convert_artifact(builtin_artifact, out)
    return out


def _types(model) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.output, *inferred.value_info)}


def test_the_fp16_twin_is_an_fp16_network_with_fp32_islands(builtin_artifact, fp16):
    """Activations and the KV cache are fp16: every product of a weight, every residual sum (an Add
    of a product's result) and the cache inputs and outputs; the islands are fp32 in and out (norms'
    statistics, softmax, reductions, the logit head, the sampler's Log/Exp/TopK), the heads and
    embeddings read fp32 weights, and the other graph edges keep their types. The clone encoders,
    which run on ONNX Runtime only, stay fp32."""
    artifact = load_artifact(fp16)
    assert artifact.precision == "fp16"
    half, single = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    for role in ("talker", "code_predictor", "vocoder"):
        model = onnx.load(str(artifact.file(role)))
        source = onnx.load(str(load_artifact(builtin_artifact).file(role))).graph
        graph, types = model.graph, _types(model)
        inits = {i.name: i for i in graph.initializer}
        kinds = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
        for value in (*source.input, *source.output):
            want = half if value.name.startswith(("past_", "new_")) else value.type.tensor_type.elem_type
            assert kinds[value.name] == want, (role, value.name)
        weighed = [n for n in graph.node if n.op_type in ("MatMul", "Conv", "ConvTranspose") and n.input[1] in inits
                   and not n.input[1].startswith("lifted_tensor")]  # the sampler's constant is not a weight
        assert weighed and all(types.get(n.output[0]) == half and inits[n.input[1]].data_type == half for n in weighed)
        results = {n.output[0] for n in weighed}
        residual = [n for n in graph.node if n.op_type == "Add" and results & set(n.input)]
        assert all(types.get(n.output[0]) == half for n in residual), role
        for node in graph.node:
            if node.op_type in ISLAND_OPS:
                floats = [v for v in (*node.input, *node.output) if types.get(v) in (half, single)]
                assert all(types[v] == single for v in floats), f"{role}: {node.op_type} {node.name} is not fp32"
            if node.op_type in ("Gemm", "Gather"):
                assert not any(inits[i].data_type == half for i in node.input if i in inits) or \
                    node.op_type == "Gather" and node.input[0] in inits and len(inits[node.input[0]].dims) == 3
    for role in ("speaker_encoder", "codec_encoder"):
        graph = onnx.load(str(artifact.file(role))).graph
        assert not any(i.data_type == half for i in graph.initializer), role


def test_the_fp16_twin_decides_like_fp32_teacher_forced(builtin_artifact, fp16, tmp_path):
    """fp32 speaks each text greedily; the fp16 twin is fed exactly those frames (teacher forcing:
    scripts/quant_quality.py's harness; scripts/bench/fp16.py measures the same graph by graph) and
    judged decision by decision, so one near-tie cannot flip the rest of a request: every code-0 and
    residual-group logit is within LOGIT_BOUND of fp32's, a decision differs only where fp32's own
    margin to the fp16 choice is within twice that (a near-tie), and fp32's frames vocoded by the fp16
    vocoder are within SNR_DB of the fp32 vocoder's PCM (51.9 dB here, on every text together)."""
    from edged.backends import onnxruntime as edged_ort

    ref_art, half_art = load_artifact(builtin_artifact), load_artifact(fp16)
    ref = quant_quality.Model(ref_art, 1, edged_ort.ACCURACY_LEVEL, tmp_path)
    half = quant_quality.Model(half_art, 1, edged_ort.ACCURACY_LEVEL, tmp_path)
    worst, decisions, near_ties = 0.0, 0, []
    for text in TEXTS:
        rows, track, pad = quant_quality.prompt(ref_art, text)
        greedy = ref.run(rows, track, None, FRAMES, pad)
        frames = np.stack([f for _, _, f in greedy])
        for (l0, lg, want), (h0, hg, got) in zip(greedy, half.run(rows, track, frames, FRAMES, pad)):
            for ref_logits, half_logits in ((l0, h0), *zip(lg, hg)):
                finite = np.isfinite(ref_logits)
                worst = max(worst, float(np.abs(ref_logits[finite] - half_logits[finite]).max()))
            for ref_logits, w, g in zip((l0, *lg), want, got):
                decisions += 1
                if w != g:
                    near_ties.append(float(ref_logits[w] - ref_logits[g]))
        pcm32, pcm16 = (quant_quality.vocode(a, frames, 1) for a in (ref_art, half_art))
        snr = 10 * np.log10(np.sum(pcm32 ** 2) / np.sum((pcm32 - pcm16) ** 2))
        assert snr >= SNR_DB, (text, snr)
    print(f"fp16: worst logit difference {worst:.1e}, {len(near_ties)} of {decisions} decisions differ {near_ties}")
    assert worst <= LOGIT_BOUND and all(margin <= 2 * LOGIT_BOUND for margin in near_ties), (worst, near_ties)


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
        assert_split_at_the_threshold(streamed, role)
        ort.InferenceSession(str(art / graph.file), providers=["CPUExecutionProvider"])
        streamed = onnx.load(str(art / graph.file))
        whole = onnx.load(str(fp16 / graph.file))
        assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in whole.graph.node]
        assert {i.name: i.raw_data for i in streamed.graph.initializer} == \
            {i.name: onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(i)).raw_data for i in whole.graph.initializer}

