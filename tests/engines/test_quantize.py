"""Weight-only int8 / int4 artifacts (engines/quantize.py): the block quantization itself, the graphs
it writes (DequantizeLinear before each MatMul of a weight one product reads, which ONNX Runtime
fuses into MatMulNBits), the manifest that says so, the CLI, and the teacher-forced comparison with
fp32 (scripts/quant_quality.py) that docs/performance.md's quality table comes from."""

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
from engines.quantize import dequantize, quantize_artifact, quantize_block

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import quant_quality


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
    return out, stats


def test_a_quantized_artifact_says_what_it_holds_and_runs(quantized, backend, tmp_path):
    out, stats = quantized
    for weights in ("int8", "int4"):
        artifact = load_artifact(out / weights)
        assert (artifact.weights, artifact.weight_block, artifact.precision) == (weights, 32, "fp32")
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
                                                "weights and 0 for fp32, got 32"),
                          ({"precision": "fp16"}, "'model.weights' int4 needs 'model.precision' fp32")):
        broken = json.loads(json.dumps(raw))
        broken["model"].update(edit)
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
    assert "talker:" in capsys.readouterr().out and load_artifact(tmp_path / "q").weights == "int8"
    with pytest.raises(ValueError, match="quantize an fp32 one"):
        engines_main(["quantize", "--artifact", str(out / "int4"), "--out", str(tmp_path / "again"), "--weights", "int8"])
    with pytest.raises(SystemExit, match="--weights int8/int4 needs --precision fp32"):
        engines_main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "x"), "--precision", "fp16",
                      "--weights", "int4"])
