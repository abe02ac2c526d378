"""Weight-only int8 / int4 artifacts (engines/quantize.py, engines/weight_form.py): the block
quantization itself, the forms each backend runs (cpu: DequantizeLinear before each MatMul of a weight
one product reads, which ONNX Runtime fuses into MatMulNBits; jetson: INT4 in 64/128-row blocks with
fp16 scales around an fp16 product, what TensorRT 10.3 builds into INT4-weight GEMMs), the manifest
that says which, the CLI, and the teacher-forced comparison with fp32 (scripts/quant_quality.py)
that docs/dev/performance.md's quality table comes from."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edged.artifact import ArtifactError, load_artifact
from edged.backends import onnxruntime as edged_ort
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.cli import main as engines_main
from engines.quantize import quantize_artifact, weight_rows
from engines.tensorrt import weights_refusal
from engines.weight_form import FormError, cpu_block, dequantize, form, quantize_block

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import quant_quality
from support.onnx_files import assert_split_at_the_threshold


@pytest.mark.parametrize("bits", [8, 4])
def test_block_quantization_is_within_half_a_step(bits):
    w = np.random.default_rng(bits).standard_normal((96, 40)).astype(np.float32)
    w[:32, 3] = 0.0  # an all-zero block keeps a usable scale
    q, scale = quantize_block(w, bits, 32)
    assert q.dtype == np.int8 and scale.shape == (3, 40)
    assert q.min() >= -(2 ** (bits - 1)) and q.max() <= 2 ** (bits - 1) - 1
    step = np.repeat(scale, 32, axis=0)
    assert np.all(np.abs(dequantize(q, scale, 32) - w) <= step / 2 + 1e-7)
    assert np.all(q[:32, 3] == 0)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, builtin_artifact):
    out = tmp_path_factory.mktemp("quantized")
    stats = {w: quantize_artifact(builtin_artifact, out / w, w) for w in ("int8", "int4")}
    stats["jetson"] = quantize_artifact(builtin_artifact, out / "jetson", "int4", "jetson", block=64)
    return out, stats


def test_a_quantized_artifact_says_what_it_holds_and_runs(quantized, backend, tmp_path):
    out, stats = quantized
    for weights in ("int8", "int4"):
        artifact = load_artifact(out / weights)
        assert (artifact.weights, artifact.weight_block, artifact.weight_target, artifact.precision) == \
            (weights, 64, "cpu", "fp32")  # the builtin's K are 64 and 128
        assert stats[weights]["talker"]["weights"] > 0 and stats[weights]["code_predictor"]["weights"] > 0
        talker = onnx.load(str(artifact.file("talker")))
        assert any(n.op_type == "DequantizeLinear" for n in talker.graph.node)
        assert {o.version for o in talker.opset_import if o.domain in ("", "ai.onnx")} == {21}
        # ONNX Runtime fuses every DequantizeLinear + MatMul into its weight-only kernel
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = str(tmp_path / f"{weights}.onnx")
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", edged_ort.ACCURACY_LEVEL)
        ort.InferenceSession(str(artifact.file("talker")), opts, providers=["CPUExecutionProvider"])
        ops = {n.op_type for n in onnx.load(str(tmp_path / f"{weights}.onnx")).graph.node}
        assert "MatMulNBits" in ops and "DequantizeLinear" not in ops
        result = Synthesizer(artifact, backend).synthesize(
            [SpeechRequest("q", "Hello there.", voice="vivian", sampling=Sampling.greedy(), max_frames=12)])[0]
        assert result.frames.shape == (12, artifact.dims.code_groups) and np.isfinite(result.pcm).all()


def test_a_quantized_graph_with_external_data_loads_and_computes_the_same(quantized, builtin_artifact, backend,
                                                                          tmp_path, monkeypatch):
    """A talker past INLINE_BYTES is written with `<graph>.onnx.data` beside it: its shape constants
    stay in the graph (ONNX Runtime refuses to infer shapes from external ones), and it runs to the
    frames the one-file artifact gives."""
    import engines.onnx_data

    monkeypatch.setattr(engines.onnx_data, "INLINE_BYTES", 0)
    quantize_artifact(builtin_artifact, tmp_path / "int4", "int4")
    streamed = load_artifact(tmp_path / "int4")
    assert streamed.file("talker").with_name("talker.onnx.data").exists()
    assert_split_at_the_threshold(onnx.load(str(streamed.file("talker")), load_external_data=False), "talker")
    request = SpeechRequest("q", "Hello there.", voice="vivian", sampling=Sampling.greedy(), max_frames=12)
    frames = [Synthesizer(a, backend).synthesize([request])[0].frames
              for a in (streamed, load_artifact(quantized[0] / "int4"))]
    assert np.array_equal(frames[0], frames[1])


def test_teacher_forced_comparison(quantized, builtin_artifact):
    """The harness itself: fp32 against fp32 agrees exactly; int8 is closer to fp32 than int4."""
    out, _ = quantized
    ref_art = load_artifact(builtin_artifact)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        ref = quant_quality.Model(ref_art, 1, edged_ort.ACCURACY_LEVEL, Path(tmp))
        rows_, track, pad = quant_quality.prompt(ref_art, quant_quality.TEXTS[0])
        greedy = ref.run(rows_, track, None, 12, pad)
        frames = np.stack([f for _, _, f in greedy])
        for name, path in (("fp32", builtin_artifact), ("int8", out / "int8"), ("int4", out / "int4")):
            model = quant_quality.Model(load_artifact(path), 1, edged_ort.ACCURACY_LEVEL, Path(tmp))
            forced = model.run(rows_, track, frames, len(frames), pad)
            rows[name] = (np.mean([quant_quality.kl(a[0], b[0]) for a, b in zip(greedy, forced)]),
                          np.stack([f for _, _, f in forced]))
    assert rows["fp32"][0] == 0.0 and np.array_equal(rows["fp32"][1], frames)
    assert 0 < rows["int8"][0] < rows["int4"][0]


def test_bad_weights_in_a_manifest_are_named(quantized):
    out, _ = quantized
    raw = json.loads((out / "int4" / "artifact.json").read_text())
    for edit, message in (({"weights": "int3"}, "'model.weights' must be one of fp32, int8, int4"),
                          ({"weight_block": 0}, "'model.weight_block' must be a positive integer"),
                          ({"weights": "fp32"}, "'model.weight_block' must be a positive integer for quantized "
                                                "weights and 0 for fp32, got 64"),
                          ({"precision": "fp16"}, "'model.weights' int4 for cpu needs 'model.precision' fp32"),
                          ({"weight_target": "jetson"}, "'model.weights' int4 for jetson needs 'model.precision' fp16, "
                                                        "got fp32 \\(quantize the fp32 artifact again"),
                          ({"weight_target": "gpu"}, "'model.weight_target' must be one of cpu, jetson for quantized "
                                                     "weights and absent for fp32, got 'gpu'"),
                          ({"weight_target": None}, "missing key 'model.weight_target'")):
        broken = json.loads(json.dumps(raw))
        broken["model"].update(edit)
        broken["model"] = {k: v for k, v in broken["model"].items() if v is not None}
        (out / "int4" / "artifact.json").write_text(json.dumps(broken))
        try:
            with pytest.raises(ArtifactError, match=message):
                load_artifact(out / "int4")
        finally:
            (out / "int4" / "artifact.json").write_text(json.dumps(raw))


def test_the_cli_quantizes_and_refuses_what_it_cannot(quantized, builtin_artifact, tmp_path, capsys):
    out, _ = quantized
    assert engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "q"),
                         "--weights", "int8"]) == 0
    printed = capsys.readouterr().out
    assert "talker:" in printed and load_artifact(tmp_path / "q").weights == "int8"
    assert "form: int8 for cpu, 64-row blocks" in printed  # the block chosen for the builtin's K
    with pytest.raises(SystemExit, match="^edged-engines: .*int4: the artifact is fp32 with int4 weights; quantize an fp32 one"):
        engines_main(["quantize", "--artifact", str(out / "int4"), "--out", str(tmp_path / "again"), "--weights", "int8"])
    with pytest.raises(SystemExit, match="the artifact is fp16 with int4 weights; quantize an fp32 or fp16 one"):
        engines_main(["quantize", "--artifact", str(out / "jetson"), "--out", str(tmp_path / "again"), "--weights",
                      "int4", "--target", "jetson"])
    with pytest.raises(SystemExit, match="--weights int8/int4 for cpu needs --precision fp32"):
        engines_main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "x"), "--precision", "fp16",
                      "--weights", "int4"])
    with pytest.raises(SystemExit, match="edged-engines: int8 has no Jetson form"):
        engines_main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "x"), "--weights", "int8",
                      "--target", "jetson"])
    with pytest.raises(SystemExit, match="edged-engines: block 32: TensorRT 10.3's INT4 weight-only blocks"):
        engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "j"), "--weights", "int4",
                      "--target", "jetson", "--block", "32"])
    assert engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "j"), "--weights",
                         "int4", "--target", "jetson", "--block", "64"]) == 0
    assert "form: int4 for jetson, 64-row blocks, fp16 network" in capsys.readouterr().out


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.output, *inferred.value_info)}


def test_the_jetson_form_is_an_fp16_network_whose_int4_blocks_feed_fp16_products_directly(quantized, fp16_twin):
    """What TensorRT 10.3 builds into INT4-weight fp16 GEMMs (engines/weight_form.py cites the rules):
    the fp16 network of engines/fp16.py (fp16 KV cache in and out, the other edges as they were) whose
    every quantized product reads INT4 in 64-row blocks through fp16 scales with no zero point, and
    whose DequantizeLinear's fp16 output meets an fp16 activation in the MatMul: no Cast is added
    around a product (the graph has exactly the fp16 network's casts, and nothing casts a product's
    result). The logit head stays fp32 and unquantized (Gemm), as the fp16 network keeps it."""
    out, stats = quantized
    artifact = load_artifact(out / "jetson")
    assert (artifact.precision, artifact.weights, artifact.weight_block, artifact.weight_target) == \
        ("fp16", "int4", 64, "jetson")
    for role in ("talker", "code_predictor"):
        model = onnx.load(str(artifact.file(role)))
        graph, types = model.graph, _types(model)
        edges = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
        assert {t for n, t in edges.items() if n.startswith(("past_", "new_"))} == {onnx.TensorProto.FLOAT16}
        assert edges["inputs_embeds"] == edges["hidden"] == onnx.TensorProto.FLOAT
        inits = {i.name: i for i in graph.initializer}
        dqs = [n for n in graph.node if n.op_type == "DequantizeLinear"]
        assert len(dqs) == stats["jetson"][role]["weights"] > 0
        for dq in dqs:
            assert len(dq.input) == 2  # no zero point: symmetric, what TensorRT's importer takes
            assert inits[dq.input[0]].data_type == onnx.TensorProto.INT4
            assert inits[dq.input[1]].data_type == onnx.TensorProto.FLOAT16
            assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 64}
            [product] = [n for n in graph.node if dq.output[0] in n.input]
            assert product.op_type == "MatMul" and product.input[1] == dq.output[0]
            assert types[product.input[0]] == types[product.output[0]] == onnx.TensorProto.FLOAT16, product.name
            assert not [n for n in graph.node if product.output[0] in n.input and n.op_type == "Cast"], product.name
        twin = onnx.load(str(fp16_twin / f"{role}.onnx")).graph
        casts = [sum(n.op_type == "Cast" for n in g.node) for g in (graph, twin)]
        assert casts[0] == casts[1], casts
        heads = [n for n in graph.node if n.op_type == "Gemm"]
        assert all(inits[n.input[1]].data_type == onnx.TensorProto.FLOAT for n in heads)


@pytest.fixture(scope="module")
def fp16_twin(builtin_artifact, tmp_path_factory):
    from engines.fp16 import convert_artifact

    out = tmp_path_factory.mktemp("fp16") / "art"
    convert_artifact(builtin_artifact, out)
    return out


def test_the_jetson_form_made_from_the_fp16_twin_is_the_one_made_from_fp32(quantized, fp16_twin, tmp_path):
    """`quantize --target jetson` takes either: from fp32 it makes the fp16 network first."""
    quantize_artifact(fp16_twin, tmp_path / "j", "int4", "jetson", block=64)
    for role in ("talker", "code_predictor", "vocoder"):
        made = onnx.load(str(tmp_path / "j" / f"{role}.onnx")).graph
        want = onnx.load(str(quantized[0] / "jetson" / f"{role}.onnx")).graph
        assert [n.SerializeToString() for n in made.node] == [n.SerializeToString() for n in want.node]
        assert {i.name: i.raw_data for i in made.initializer} == {i.name: i.raw_data for i in want.initializer}


JETSON_LOGIT_BOUND = 0.05
"""The Jetson form against an fp32 network holding the same dequantized weights, teacher-forced: any
logit of code 0 or a group (3.2e-2 at worst here over 384 decisions); the fp16 arithmetic is all
that differs."""
EXACT_LEVEL = "1"
"""MatMulNBits computing in floating point, as TensorRT's INT4-weight GEMMs do (edged's CPU default, 4,
quantizes each product's activations to int8: 0.2 of a logit here, the CPU kernel's error, not the form's)."""
JETSON_SNR_DB = 30
"""Its fp16 vocoder on fp32's frames against the fp32 vocoder (51.9 dB here)."""


def test_the_jetson_form_runs_on_onnxruntime_and_agrees_with_fp32_of_the_same_weights(quantized, builtin_artifact,
                                                                                     backend, tmp_path):
    """ONNX Runtime runs the Jetson form (the device check compares TensorRT's frames with these).
    Against the fp32 network whose weights are the Jetson form's dequantized INT4 values, fed the
    same frames (scripts/quant_quality.py's harness): every code-0 and group logit is within
    JETSON_LOGIT_BOUND (EXACT_LEVEL), a decision differs only at a near-tie (fp32's margin within twice that), and
    the fp16 vocoder keeps JETSON_SNR_DB of the fp32 vocoder's PCM; it speaks end to end."""
    import shutil

    jetson = load_artifact(quantized[0] / "jetson")
    same = tmp_path / "fp32-same-weights"
    shutil.copytree(builtin_artifact, same)
    for role in ("talker", "code_predictor"):
        half = onnx.load(str(jetson.file(role))).graph
        inits = {i.name: i for i in half.initializer}
        values = {}
        for dq in (n for n in half.node if n.op_type == "DequantizeLinear"):
            q = onnx.numpy_helper.to_array(inits[dq.input[0]]).astype(np.int8)
            values[dq.input[0].removesuffix("__q4")] = dequantize(q, onnx.numpy_helper.to_array(inits[dq.input[1]]), 64)
        model = onnx.load(str(same / f"{role}.onnx"))
        for init in model.graph.initializer:
            if init.name in values:
                init.CopyFrom(onnx.numpy_helper.from_array(values.pop(init.name), init.name))
        assert not values
        onnx.save_model(model, str(same / f"{role}.onnx"))
    reference = load_artifact(same)
    ref = quant_quality.Model(reference, 1, EXACT_LEVEL, tmp_path)
    got = quant_quality.Model(jetson, 1, EXACT_LEVEL, tmp_path)
    worst, near_ties = 0.0, []
    for text in quant_quality.TEXTS:
        rows, track, pad = quant_quality.prompt(reference, text)
        greedy = ref.run(rows, track, None, 48, pad)
        frames = np.stack([f for _, _, f in greedy])
        for (l0, lg, want), (h0, hg, mine) in zip(greedy, got.run(rows, track, frames, 48, pad)):
            for a, b in ((l0, h0), *zip(lg, hg)):
                finite = np.isfinite(a)
                worst = max(worst, float(np.abs(a[finite] - b[finite]).max()))
            near_ties += [float(a[w] - a[m]) for a, w, m in zip((l0, *lg), want, mine) if w != m]
        pcm32, pcm16 = (quant_quality.vocode(a, frames, 1) for a in (reference, jetson))
        snr = 10 * np.log10(np.sum(pcm32 ** 2) / np.sum((pcm32 - pcm16) ** 2))
        assert snr >= JETSON_SNR_DB, (text, snr)
    print(f"jetson form: worst logit difference {worst:.1e}, decisions differing {near_ties}")
    assert worst <= JETSON_LOGIT_BOUND and all(m <= 2 * JETSON_LOGIT_BOUND for m in near_ties), (worst, near_ties)
    result = Synthesizer(jetson, backend).synthesize(
        [SpeechRequest("j", "Hello there.", voice="vivian", sampling=Sampling.greedy(), max_frames=12)])[0]
    assert result.frames.shape == (12, jetson.dims.code_groups) and np.isfinite(result.pcm).all()


def test_the_cpu_default_block_is_the_largest_that_every_weight_takes(quantized, builtin_artifact):
    """128 rows where every K allows (all published sizes: 1024, 2048, 3072 ...), else the largest
    power of two down to 16 that divides them all, so the default quantizes every product a block
    can; a K no block divides stays fp32 and does not decide."""
    assert cpu_block([1024, 2048, 3072, 6144]) == 128
    assert cpu_block([64, 128]) == 64 and cpu_block([48, 96]) == 16 and cpu_block([1024, 1000]) == 128
    rows = weight_rows(load_artifact(builtin_artifact).file("talker"))
    assert sorted(set(rows)) == [64, 128]
    out, stats = quantized
    talker = onnx.load(str(load_artifact(out / "int4").file("talker")))
    blocks = {a.i for n in talker.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
              if a.name == "block_size"}
    assert blocks == {64} and stats["int4"]["talker"]["weights"] == len(rows)


def test_a_form_a_target_cannot_run_is_refused_naming_the_rule():
    assert form("int4", "jetson") == form("int4", "jetson", 128) and form("int4", "cpu").block == 128
    for args, message in ((("int8", "jetson"), "int8 has no Jetson form: TensorRT 10.3 runs weight-only quantization "
                                               "for INT4 only"),
                          (("int4", "jetson", 32), "block 32: TensorRT 10.3's INT4 weight-only blocks are 64 or 128"),
                          (("int4", "cpu", 48), "block 48: ONNX Runtime's MatMulNBits takes a power of two"),
                          (("int4", "gpu"), "target must be one of cpu, jetson")):
        with pytest.raises(FormError, match=message):
            form(*args)


def test_plans_refuse_a_form_tensorrt_cannot_build_with_the_reason(quantized):
    """`edged-engines plans` asks the form before building: an int8 artifact and a cpu-form int4 one are
    refused, each saying why and what to run instead; the jetson form is not."""
    out, _ = quantized
    model = {w: json.loads((out / w / "artifact.json").read_text())["model"] for w in ("int8", "int4", "jetson")}
    assert "int8 has no Jetson form" in weights_refusal(model["int8"])
    assert weights_refusal(model["int4"]) == (
        "its int4 weights are in the cpu form (64-row blocks, fp32 scales), and TensorRT 10.3 takes INT4 blocks of 64 "
        "or 128 rows with fp16 scales (fp32 scales make every product an fp32 GEMM): quantize the fp32 artifact with "
        "--target jetson")
    assert weights_refusal(model["jetson"]) is None and weights_refusal({"weights": "fp32"}) is None
    earlier = model["jetson"] | {"precision": "fp32"}  # an artifact quantized before the Jetson form was fp16
    assert weights_refusal(earlier) == ("its int4 Jetson weights sit in an fp32 network (the earlier form); quantize "
                                        "the fp32 artifact again with --target jetson")
