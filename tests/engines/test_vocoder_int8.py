"""The int8 vocoder (engines/vocoder_int8.py): the convolutions' weight layouts as matrix products, the
rewritten graph on ONNX Runtime against the fp32 one, an artifact with it streaming the same frames
and PCM within the bound docs/artifact.md states, and the forms and manifest that refuse it where it
cannot run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.emulated import EXACT, SATURATING, SNR_DB, qemu, run_graph, snr_db, stream_vocoder

from edged.artifact import ArtifactError, load_artifact
from edged.audio.wav import read_wav
from edged.backends import make_backend
from edged.cpu import DOT, this_cpu
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from edged.vocoder.form import choose_vocoder
from engines.cli import main as engines_main
from engines.fp16 import convert_artifact
from engines.quantize import quantize_artifact
from engines.tensorrt import weights_refusal
from engines.vocoder_int8 import conv_weight, quantize_vocoder, transposed_weight
from engines.weight_form import FormError, vocoder_form

TEXT = "Hello there, how are you today?"
LAYER_ERROR = 0.03
"""One rewritten layer's relative error at most (~1.1 % measured: 8-bit weights and activations)."""
FP32_SNR_DB = 40.0
"""The fp32 vocoder's PCM on another CPU's fp32 kernels against this one's, at least (16-bit WAV: far above
what any 8-bit form reaches)."""


def exact_cpu() -> str | None:
    """Where the int8 graphs are checked: this CPU when its 8-bit products are exact, else qemu's SSE CPU."""
    return None if not this_cpu().int8_saturates else EXACT


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
def test_a_rewritten_layer_runs_on_onnx_runtime_within_8_bit_error(op, shape, attrs, tmp_path):
    rng = np.random.default_rng(len(shape) + shape[2])
    w = (rng.standard_normal(shape) / np.sqrt(shape[1] * shape[2])).astype(np.float32)
    b = rng.standard_normal(shape[1] if op == "ConvTranspose" else shape[0]).astype(np.float32)
    x = rng.standard_normal((1, shape[0] if op == "ConvTranspose" else shape[1], 50)).astype(np.float32)
    fp32 = _one_layer(op, w, b, **attrs)
    int8 = _one_layer(op, w, b, **attrs)
    assert quantize_vocoder(int8) == {op: 1, "parameters": w.size}
    assert {n.op_type for n in int8.graph.node}.isdisjoint({"Conv", "ConvTranspose"})
    onnx.save(int8, str(tmp_path / "int8.onnx"))
    want = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_graph(tmp_path / "int8.onnx", {"x": x}, exact_cpu(), tmp_path)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < LAYER_ERROR


def test_uint8_weights_give_the_exact_products_where_int8_weights_saturate(tmp_path):
    """The uint8 twin's form (quantize_vocoder(unsigned=True): the same values as uint8 with zero point
    128) runs ONNX Runtime's uint8 x uint8 kernels, which widen to 16 bits: under Haswell's kernels its
    layer equals the int8 form's on exact kernels, where the int8 form's own products saturate."""
    if qemu() is None:
        pytest.skip("needs qemu-x86_64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)")
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((48, 32, 7)) / np.sqrt(32 * 7)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    x = rng.standard_normal((1, 32, 50)).astype(np.float32)
    graphs = {}
    for form, unsigned in (("signed", False), ("unsigned", True)):
        model = _one_layer("Conv", w, b, dilations=[3])
        quantize_vocoder(model, unsigned=unsigned)
        graphs[form] = tmp_path / f"{form}.onnx"
        onnx.save(model, str(graphs[form]))
    exact = run_graph(graphs["signed"], {"x": x}, exact_cpu(), tmp_path / "exact")
    widened = run_graph(graphs["unsigned"], {"x": x}, SATURATING, tmp_path / "widened")
    saturated = run_graph(graphs["signed"], {"x": x}, SATURATING, tmp_path / "saturated")
    np.testing.assert_allclose(widened, exact, rtol=0, atol=1e-5 * np.abs(exact).max())
    assert np.abs(saturated - exact).max() > 0.01 * np.abs(exact).max()


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


def _speak(artifact, backend):
    request = SpeechRequest("v", TEXT, voice="vivian", sampling=Sampling.greedy(), max_frames=24)
    return Synthesizer(artifact, backend).synthesize([request])[0]


def test_an_int8_vocoder_artifact_keeps_its_fp32_vocoder_and_speaks_the_same_frames(int8_vocoder, builtin_artifact,
                                                                                    backend, tmp_path):
    """The three graphs are there, the fp32 one unchanged; on this CPU the daemon's rule picks one
    (edged/vocoder/form.py); the int8 twin's PCM meets the bound on exact 8-bit kernels, whatever this CPU's."""
    out, stats = int8_vocoder
    artifact = load_artifact(out)
    assert (artifact.vocoder_weights, artifact.weights, artifact.precision) == ("int8", "fp32", "fp32")
    assert set(stats) == {"vocoder"} and stats["vocoder"]["Conv"] > 0 and stats["vocoder"]["ConvTranspose"] > 0
    manifest = json.loads((out / "artifact.json").read_text())
    assert manifest["model"]["vocoder_weights"] == "int8"
    files = [manifest["files"][role] for role in ("vocoder", "vocoder_int8", "vocoder_uint8")]
    assert files == ["vocoder.onnx", "vocoder_int8.onnx", "vocoder_uint8.onnx"]
    assert (out / "vocoder.onnx").read_bytes() == (builtin_artifact / "vocoder.onnx").read_bytes()
    assert artifact.graphs["vocoder_int8"].state == artifact.graphs["vocoder_uint8"].state == artifact.graphs["vocoder"].state
    fp32, here = _speak(load_artifact(builtin_artifact), backend), _speak(artifact, backend)
    assert np.array_equal(fp32.frames, here.frames)
    assert fp32.pcm.shape == here.pcm.shape
    form = choose_vocoder(artifact, backend.name)
    cpu = this_cpu()
    runs_int8 = backend.name == "onnxruntime" and (cpu.int8_products in DOT or cpu.int8_saturates)
    assert form.weights == ("int8" if runs_int8 else "fp32")
    if form.weights == "int8":
        assert snr_db(fp32.pcm, here.pcm) >= SNR_DB
    else:
        assert np.array_equal(fp32.pcm, here.pcm)
    pcm = _twin_pcm(artifact, fp32.frames, exact_cpu(), tmp_path)
    assert snr_db(fp32.pcm[:pcm.shape[1]], pcm[0]) >= SNR_DB


def _twin_pcm(artifact, frames: np.ndarray, cpu: str | None, work, twin: str = "vocoder_int8") -> np.ndarray:
    """An int8 twin's PCM of `frames` [F, G], streamed in windows of 4 under `cpu` (emulated.py)."""
    state = [(s.input, s.output, s.shape) for s in artifact.graphs[twin].state]
    return stream_vocoder(artifact.file(twin), frames.T[None].astype(np.int64), state, 4, cpu, work)


def test_on_a_cpu_whose_int8_products_saturate_the_daemon_runs_the_uint8_twin_and_says_so(int8_vocoder,
                                                                                            builtin_artifact, tmp_path):
    """Haswell's kernels under qemu (AVX2, no VNNI: tests/support/emulated.py), from any x86 machine: the
    int8 twin there is far below the bound (the rig reproduces the saturating path users met), the
    uint8 twin gives the exact kernels' PCM, and `edged synth` on the int8 artifact names the uint8
    twin and speaks its PCM."""
    if qemu() is None:
        pytest.skip("needs qemu-x86_64 on an x86-64 host (scripts/install-system-deps.sh installs qemu-user)")
    out, _ = int8_vocoder
    artifact = load_artifact(out)
    fp32 = _speak(load_artifact(builtin_artifact), make_backend("onnxruntime", 1))
    saturated = _twin_pcm(artifact, fp32.frames, SATURATING, tmp_path / "twin")
    assert snr_db(fp32.pcm[:saturated.shape[1]], saturated[0]) < SNR_DB - 5
    exact = _twin_pcm(artifact, fp32.frames, EXACT, tmp_path / "exact")
    assert snr_db(fp32.pcm[:exact.shape[1]], exact[0]) >= SNR_DB
    widened = _twin_pcm(artifact, fp32.frames, SATURATING, tmp_path / "uint8", "vocoder_uint8")
    assert snr_db(exact[0], widened[0]) >= FP32_SNR_DB  # the exact products, on the kernels that saturate int8
    wav = tmp_path / "haswell.wav"
    done = subprocess.run([qemu(), "-cpu", SATURATING, sys.executable, "-m", "edged", "synth", "--artifact", str(out),
                           "--text", TEXT, "--speaker", "vivian", "--greedy", "--max-frames", "24", "--out", str(wav)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("edged synth: vocoder: int8 (uint8 weights: this CPU's uint8 x int8 products (avx2, no VNNI) saturate "
            "16-bit sums, its uint8 x uint8 ones do not)") in done.stderr
    pcm, _ = read_wav(wav)
    assert SNR_DB <= snr_db(fp32.pcm, pcm) < FP32_SNR_DB  # within the int8 bound, and not the fp32 vocoder's PCM


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
    # the vocoder of an artifact whose weights are quantized already, in a second step
    assert engines_main(["quantize", "--artifact", str(builtin_artifact), "--out", str(tmp_path / "w"),
                         "--weights", "int4"]) == 0
    assert engines_main(["quantize", "--artifact", str(tmp_path / "w"), "--out", str(tmp_path / "wv"),
                         "--vocoder", "int8"]) == 0
    later = load_artifact(tmp_path / "wv")
    assert (later.weights, later.vocoder_weights) == ("int4", "int8")
    for twin in ("vocoder_int8.onnx", "vocoder_uint8.onnx"):
        assert (tmp_path / "wv" / twin).read_bytes() == (tmp_path / "both" / twin).read_bytes()
    with pytest.raises(SystemExit, match="edged-engines: .*wv: the vocoder is already int8"):
        engines_main(["quantize", "--artifact", str(tmp_path / "wv"), "--out", str(tmp_path / "again"), "--vocoder", "int8"])


@pytest.mark.parametrize("model, message", [
    ({"vocoder_weights": "int4"}, "'model.vocoder_weights' must be one of fp32, int8, got 'int4'"),
    ({"vocoder_weights": "int8", "precision": "fp16"}, "'model.vocoder_weights' int8 needs 'model.precision' fp32"),
    ({"vocoder_weights": "int8"}, "'model.vocoder_weights' int8 names no 'tensors.vocoder_int8' graph: this artifact's "
                                  "vocoder.onnx is the int8 graph itself, from an earlier edged-engines, with no fp32 "
                                  r"vocoder for CPUs where int8 runs wrong; quantize the fp32 artifact again \(edged-"),
])
def test_the_manifest_names_a_bad_vocoder_form(builtin_artifact, tmp_path, model, message):
    manifest = json.loads((builtin_artifact / "artifact.json").read_text())
    manifest["model"].update(model)
    with pytest.raises(ArtifactError, match=message):
        load_artifact(_linked(builtin_artifact, manifest, tmp_path))


@pytest.mark.parametrize("change, message", [
    (lambda m: m["model"].pop("vocoder_weights"), "'model.vocoder_weights' fp32 with a 'tensors.vocoder_int8' graph"),
    (lambda m: m["tensors"]["vocoder_int8"]["state"].pop(), "'tensors.vocoder_int8' must have the inputs, outputs and "
                                                             "state of 'tensors.vocoder'"),
    (lambda m: m["tensors"]["vocoder_uint8"]["state"].pop(), "'tensors.vocoder_uint8' must have the inputs, outputs "
                                                              "and state of 'tensors.vocoder'"),
    (lambda m: (m["tensors"].pop("vocoder_int8"), m["files"].pop("vocoder_int8"), m["model"].pop("vocoder_weights")),
     "a 'tensors.vocoder_uint8' graph without 'tensors.vocoder_int8': the uint8 form is the int8 vocoder's twin"),
])
def test_the_manifest_names_an_int8_twin_that_does_not_fit(int8_vocoder, tmp_path, change, message):
    out, _ = int8_vocoder
    manifest = json.loads((out / "artifact.json").read_text())
    change(manifest)
    with pytest.raises(ArtifactError, match=message):
        load_artifact(_linked(out, manifest, tmp_path))


def _linked(artifact, manifest: dict, out):
    """`artifact`'s files linked into `out`, with `manifest` as its artifact.json."""
    for f in artifact.iterdir():
        if f.name != "artifact.json":
            (out / f.name).symlink_to(f)
    (out / "artifact.json").write_text(json.dumps(manifest))
    return out


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
    state = [(i, o, tuple(shape)) for i, o, (_, shape) in zip(state_in, state_out, codec.state_specs())]
    pcm = {form: stream_vocoder(tmp_path / f"{form}.onnx", codes, state, 4, cpu, tmp_path / form)[:, config.lead_samples:]
           for form, cpu in (("fp32", None), ("int8", exact_cpu()))}
    assert np.abs(pcm["fp32"]).max() > 1e-3
    assert snr_db(pcm["fp32"], pcm["int8"]) >= SNR_DB
