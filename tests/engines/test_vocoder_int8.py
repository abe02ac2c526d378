"""The int8 vocoder (engines/vocoder_int8.py): the convolutions' weight layouts as matrix products, the
rewritten graph on ONNX Runtime against the fp32 one, an artifact with it streaming the same frames
and PCM within the bound docs/artifact.md states, and the forms and manifest that refuse it where it
cannot run."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from edged.artifact import ArtifactError, load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.cli import main as engines_main
from engines.fp16 import convert_artifact
from engines.quantize import quantize_artifact
from engines.tensorrt import weights_refusal
from engines.vocoder_int8 import conv_weight, quantize_vocoder, transposed_weight
from engines.weight_form import FormError, vocoder_form

SNR_DB = 20.0
"""The int8 vocoder's PCM against the fp32 one's, at least (docs/artifact.md: 22-23 dB measured)."""
LAYER_ERROR = 0.03
"""One rewritten layer's relative error at most (~1.1 % measured: 8-bit weights and activations)."""


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - other)))


@pytest.mark.parametrize("dilation", [1, 3])
def test_a_conv_is_its_taps_side_by_side_times_the_weight(dilation):
    rng = np.random.default_rng(dilation)
    x = rng.standard_normal((2, 6, 30)).astype(np.float32)
    w = rng.standard_normal((5, 6, 7)).astype(np.float32)
    want = torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(w), dilation=dilation).numpy()
    t = x.shape[-1] - 6 * dilation
    cols = np.concatenate([x.transpose(0, 2, 1)[:, j * dilation: j * dilation + t] for j in range(7)], axis=-1)
    got = (cols @ conv_weight(w)).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_transposed_conv_is_each_frame_beside_the_one_before_times_the_weight():
    rng = np.random.default_rng(0)
    stride, x = 3, rng.standard_normal((2, 6, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4, 2 * stride)).astype(np.float32)
    want = torch.nn.functional.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w), stride=stride).numpy()
    xt = np.pad(x.transpose(0, 2, 1), ((0, 0), (1, 1), (0, 0)))  # [B, L + 2, C]: zero frames at both ends
    cols = np.concatenate([xt[:, 1:], xt[:, :-1]], axis=-1)  # frame m beside frame m - 1, m in 0..L
    got = (cols @ transposed_weight(w, stride)).reshape(2, -1, 4).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="kernel 5 is not 2 x stride 3"):
        transposed_weight(w[..., :5], stride)


def _one_layer(op: str, w: np.ndarray, b: np.ndarray, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "w", "b"], ["y"], name="layer", **attrs)
    channels = w.shape[0 if op == "ConvTranspose" else 1]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", channels, "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op, shape, attrs", [
    ("Conv", (48, 32, 7), {"dilations": [3]}),
    ("Conv", (48, 32, 1), {}),
    ("ConvTranspose", (32, 24, 8), {"strides": [4]}),
])
def test_a_rewritten_layer_runs_on_onnx_runtime_within_8_bit_error(op, shape, attrs):
    rng = np.random.default_rng(len(shape) + shape[2])
    w = (rng.standard_normal(shape) / np.sqrt(shape[1] * shape[2])).astype(np.float32)
    b = rng.standard_normal(shape[1] if op == "ConvTranspose" else shape[0]).astype(np.float32)
    x = rng.standard_normal((1, shape[0] if op == "ConvTranspose" else shape[1], 50)).astype(np.float32)
    fp32 = _one_layer(op, w, b, **attrs)
    int8 = _one_layer(op, w, b, **attrs)
    assert quantize_vocoder(int8) == {op: 1, "parameters": w.size}
    assert {n.op_type for n in int8.graph.node}.isdisjoint({"Conv", "ConvTranspose"})
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                 for m in (fp32, int8))
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < LAYER_ERROR


@pytest.mark.parametrize("op, shape, attrs", [
    ("Conv", (8, 1, 7), {"group": 8}),  # depthwise
    ("Conv", (1, 8, 7), {}),  # to one channel
    ("ConvTranspose", (8, 8, 2), {"strides": [2]}),  # no overlap: kernel = stride
    ("Conv", (8, 8, 3), {"pads": [1, 1]}),
])
def test_convs_it_does_not_rewrite_stay_fp32(op, shape, attrs):
    model = _one_layer(op, np.ones(shape, np.float32), np.zeros(shape[1] if op == "ConvTranspose" else shape[0],
                                                                    np.float32), **attrs)
    assert quantize_vocoder(model) == {f"{op} kept fp32": 1}
    assert [n.op_type for n in model.graph.node] == [op]


@pytest.fixture(scope="module")
def int8_vocoder(tmp_path_factory, builtin_artifact):
    out = tmp_path_factory.mktemp("vocoder-int8")
    stats = quantize_artifact(builtin_artifact, out, None, vocoder="int8")
    return out, stats


def test_an_int8_vocoder_artifact_speaks_the_same_frames_within_the_stated_snr(int8_vocoder, builtin_artifact, backend):
    out, stats = int8_vocoder
    artifact = load_artifact(out)
    assert (artifact.vocoder_weights, artifact.weights, artifact.precision) == ("int8", "fp32", "fp32")
    assert set(stats) == {"vocoder"} and stats["vocoder"]["Conv"] > 0 and stats["vocoder"]["ConvTranspose"] > 0
    assert json.loads((out / "artifact.json").read_text())["model"]["vocoder_weights"] == "int8"
    request = SpeechRequest("v", "Hello there, how are you today?", voice="vivian", sampling=Sampling.greedy(),
                            max_frames=24)
    fp32, int8 = (Synthesizer(a, backend).synthesize([request])[0] for a in (load_artifact(builtin_artifact), artifact))
    assert np.array_equal(fp32.frames, int8.frames)
    assert fp32.pcm.shape == int8.pcm.shape
    assert snr_db(fp32.pcm, int8.pcm) >= SNR_DB


def test_the_int8_vocoder_is_refused_where_it_cannot_run(int8_vocoder, builtin_artifact, tmp_path, capsys):
    out, _ = int8_vocoder
    with pytest.raises(FormError, match="the int8 vocoder has no Jetson form"):
        vocoder_form("int8", "jetson")
    with pytest.raises(FormError, match="vocoder must be int8, got 'int4'"):
        vocoder_form("int4", "cpu")
    model = json.loads((out / "artifact.json").read_text())["model"]
    assert "the int8 vocoder has no Jetson form" in weights_refusal(model)
    with pytest.raises(ValueError, match="its vocoder is int8; convert an artifact with an fp32 vocoder"):
        convert_artifact(out, tmp_path / "fp16")
    with pytest.raises(ValueError, match="the vocoder is already int8"):
        quantize_artifact(out, tmp_path / "again", "int4", vocoder="int8")
    with pytest.raises(ValueError, match="nothing to quantize"):
        quantize_artifact(builtin_artifact, tmp_path / "none", None)
    with pytest.raises(SystemExit, match="the int8 vocoder has no Jetson form"):
        engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "j"), "--vocoder", "int8",
                      "--target", "jetson"])
    assert not (tmp_path / "j").exists()
    with pytest.raises(SystemExit, match="give --weights"):
        engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "n")])


def test_the_cli_quantizes_weights_and_vocoder_together(builtin_artifact, tmp_path, capsys):
    assert engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "both"),
                         "--weights", "int4", "--vocoder", "int8"]) == 0
    printed = capsys.readouterr().out
    assert "form: int4 for cpu, 64-row blocks" in printed and "vocoder: int8" in printed
    artifact = load_artifact(tmp_path / "both")
    assert (artifact.weights, artifact.weight_target, artifact.vocoder_weights) == ("int4", "cpu", "int8")


@pytest.mark.parametrize("model, message", [
    ({"vocoder_weights": "int4"}, "'model.vocoder_weights' must be one of fp32, int8, got 'int4'"),
    ({"vocoder_weights": "int8", "precision": "fp16"}, "'model.vocoder_weights' int8 needs 'model.precision' fp32"),
])
def test_the_manifest_names_a_bad_vocoder_form(builtin_artifact, tmp_path, model, message):
    manifest = json.loads((builtin_artifact / "artifact.json").read_text())
    manifest["model"].update(model)
    for f in builtin_artifact.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "artifact.json").unlink()
    (tmp_path / "artifact.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=message):
        load_artifact(tmp_path)


def test_qwen3_omni_code2wav_takes_the_int8_form_within_the_stated_snr(tmp_path):
    """Omni's code2wav (its RVQ front end, the left-cut lead) streams through the rewritten graph on
    ONNX Runtime within the same bound as Qwen3-TTS's vocoder."""
    pytest.importorskip("transformers")
    from engines.qwen3_omni.codec import load_omni_codec
    from engines.qwen3_omni.config import Qwen3OmniConfig
    from engines.qwen3_omni.tiny import build_model
    from engines.qwen3_tts.codec_export import export_codec, state_names

    build_model(seed=10, variant=0).save_pretrained(tmp_path / "ckpt")
    config = Qwen3OmniConfig.from_checkpoint(tmp_path / "ckpt").codec
    codec = load_omni_codec(tmp_path / "ckpt", config)
    export_codec(codec, tmp_path / "fp32.onnx")
    model = onnx.load(str(tmp_path / "fp32.onnx"))
    stats = quantize_vocoder(model)
    assert stats["Conv"] > 0 and stats["ConvTranspose"] > 0
    onnx.save(model, str(tmp_path / "int8.onnx"))
    codes = np.random.default_rng(3).integers(0, config.codebook_size, (1, config.num_quantizers, 12))
    state_in, state_out = state_names(len(codec.state_specs()))
    pcm = {}
    for form in ("fp32", "int8"):
        session = ort.InferenceSession(str(tmp_path / f"{form}.onnx"), providers=["CPUExecutionProvider"])
        state = [np.zeros((1, *shape), np.float32) for _, shape in codec.state_specs()]
        parts = []
        for start in range(0, 12, 4):
            out = session.run(["pcm", *state_out], {"codes": codes[..., start:start + 4], "start": np.array([start]),
                                                    **dict(zip(state_in, state))})
            parts.append(out[0])
            state = out[1:]
        pcm[form] = np.concatenate(parts, axis=1)[:, config.lead_samples:]
    assert np.abs(pcm["fp32"]).max() > 1e-3
    assert snr_db(pcm["fp32"], pcm["int8"]) >= SNR_DB
