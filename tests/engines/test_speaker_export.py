"""The speaker-encoder graph (PCM in, x-vector out) against qwen-tts's own mel + ECAPA-TDNN path.

Three tiny random `Qwen3TTSSpeakerEncoder`s, built with the library's own classes (enc_dim 64, 96, 128;
different channel widths, Res2Net scales and attention sizes; the library's kernel sizes and dilations),
are exported once each (module-scoped fixture). For 1.0 s, 3.3 s (not a whole number of hops) and 10 s
of a deterministic signal, ONNX Runtime's x-vector must match `speaker_encoder(mel_spectrogram(...)
.transpose(1, 2))[0]`, called as `extract_speaker_embedding` calls it, within

    max |ORT - library| <= 1e-4 * max |library|

(measured: ~1e-6 absolute on x-vectors of scale ~3, i.e. ~3e-7 relative). The graph must have no
STFT/DFT node (TensorRT builds neither) and no control flow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np
import onnx
import onnxruntime as ort

from engines.qwen3_tts.reference import import_qwen_tts
from engines.qwen3_tts.speaker_export import PCM, XVECTOR, export_speaker_encoder
from engines.tiny_weights import reinit

SAMPLE_RATE = 24000
LENGTHS = (24000, 79200, 240000)  # samples: 1.0 s, 3.3 s, 10 s
RELATIVE_TOLERANCE = 1e-4
# (enc_dim, enc_channels, res2net scale, attention channels, se channels)
VARIANTS = (
    (64, [32, 32, 32, 32, 96], 4, 16, 16),
    (96, [48, 48, 48, 48, 144], 2, 24, 8),
    (128, [64, 64, 64, 64, 192], 8, 32, 16),
)


def speech_like(num_samples: int, seed: int) -> np.ndarray:
    """Deterministic float32 [N] at ~0.3 amplitude: two sines (pitches vary with the seed) and seeded noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / SAMPLE_RATE
    pcm = (0.18 * np.sin(2 * np.pi * (150 + 37 * seed) * t) + 0.08 * np.sin(2 * np.pi * (1130 + 210 * seed) * t + 1.0)
           + 0.05 * rng.standard_normal(num_samples))
    return pcm.astype(np.float32)


def library_xvector(encoder: torch.nn.Module, pcm: np.ndarray) -> np.ndarray:
    """`Qwen3TTSForConditionalGeneration.extract_speaker_embedding`'s body on float32 24 kHz audio."""
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    mels = mel_spectrogram(torch.from_numpy(pcm).unsqueeze(0), n_fft=1024, num_mels=128, sampling_rate=24000,
                           hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
    with torch.inference_mode():
        return encoder(mels)[0].numpy()


@pytest.fixture(scope="module", params=range(len(VARIANTS)), ids=lambda v: f"enc_dim{VARIANTS[v][0]}")
def exported(request, tmp_path_factory) -> tuple[torch.nn.Module, ort.InferenceSession, Path, int]:
    """(the library's encoder with seeded random weights, an ORT session on its graph, the graph path, enc_dim)."""
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    enc_dim, channels, scale, attention, se = VARIANTS[request.param]
    config = Qwen3TTSSpeakerEncoderConfig(enc_dim=enc_dim, sample_rate=SAMPLE_RATE, enc_channels=channels,
                                          enc_attention_channels=attention, enc_res2net_scale=scale,
                                          enc_se_channels=se)
    encoder = Qwen3TTSSpeakerEncoder(config).eval()
    reinit(encoder, seed=21 + request.param, tag="speaker", part="speaker_encoder")
    path = tmp_path_factory.mktemp(f"speaker{enc_dim}") / "speaker_encoder.onnx"
    export_speaker_encoder(encoder, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return encoder, session, path, enc_dim


def test_graph_names_shapes_and_dtypes(exported):
    _, _, path, enc_dim = exported
    model = onnx.load(str(path))
    (pcm,), (xvector,) = model.graph.input, model.graph.output

    def dims(value):
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    assert (pcm.name, pcm.type.tensor_type.elem_type) == (PCM, onnx.TensorProto.FLOAT)
    assert (xvector.name, xvector.type.tensor_type.elem_type) == (XVECTOR, onnx.TensorProto.FLOAT)
    assert dims(pcm)[0] == 1 and isinstance(dims(pcm)[1], str)
    assert dims(xvector) == [1, enc_dim]
    ops = {node.op_type for node in model.graph.node}
    assert not {"STFT", "DFT"} & ops, "the mel front end must not use the ONNX STFT/DFT op"
    assert not {"If", "Loop", "Scan"} & ops
    assert all(init.data_type != onnx.TensorProto.COMPLEX64 for init in model.graph.initializer)


@pytest.mark.parametrize("num_samples", LENGTHS, ids=lambda n: f"{n}samples")
def test_xvector_matches_library(exported, num_samples):
    encoder, session, _, enc_dim = exported
    pcm = speech_like(num_samples, seed=num_samples % 5)
    want = library_xvector(encoder, pcm)  # [enc_dim]
    (got,) = session.run([XVECTOR], {PCM: pcm[None]})
    assert got.dtype == np.float32 and got.shape == (1, enc_dim)
    error, scale = float(np.abs(got[0] - want).max()), float(np.abs(want).max())
    assert error <= RELATIVE_TOLERANCE * scale, f"max |ORT - library| {error:.3g} at scale {scale:.3g}"


def test_xvector_depends_on_the_audio(exported):
    """The comparison above means something only if the random encoder is not constant in its input."""
    encoder, session, _, _ = exported
    first, second = (session.run([XVECTOR], {PCM: speech_like(SAMPLE_RATE, seed)[None]})[0][0] for seed in (1, 2))
    scale = float(np.abs(first).max())
    assert float(np.abs(first - second).max()) > 100 * RELATIVE_TOLERANCE * scale
