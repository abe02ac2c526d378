"""The speech tokenizer's encoder graph (PCM in, codes out) against qwen-tts's own `speech_tokenizer.encode`.

For tiny random checkpoints of variants 0, 1 and 2 (G = 4, 8, 16 groups, different transformer shapes)
the ONNX Runtime codes must equal the library's exactly, frame count included (T = ceil(N / 1920)).
Lengths: under one frame, 1.0 s and 3.3 s (not whole frames), 10 s (exactly 125 frames), and 15 s,
which is past Mimi's configured 250-frame sliding window: transformers ignores that window, and a
graph that applied it would differ there.

Each checkpoint is built and exported once (module-scoped fixture, ~3 s each).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np
import onnx
import onnxruntime as ort

from engines.qwen3_tts.reference import load_reference
from engines.qwen3_tts.speech_encoder_export import CODES, PCM, export_speech_encoder
from engines.qwen3_tts.tiny import VARIANTS, build_tiny

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
LENGTHS = (1000, 24000, 79200, 240000, 360000)  # samples: <1 frame, 1.0 s, 3.3 s, 10 s, 15 s


def speech_like(num_samples: int, seed: int) -> np.ndarray:
    """Deterministic float32 [N] at ~0.3 amplitude: two sines (pitch varies with the seed) and seeded noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / SAMPLE_RATE
    pcm = (0.18 * np.sin(2 * np.pi * (150 + 10 * seed) * t) + 0.08 * np.sin(2 * np.pi * 1130 * t + 1.0)
           + 0.05 * rng.standard_normal(num_samples))
    return pcm.astype(np.float32)


@pytest.fixture(scope="module", params=[0, 1, 2], ids=lambda v: f"variant{v}")
def encoder(request, tmp_path_factory) -> tuple[object, ort.InferenceSession, Path, int]:
    """(the reference speech tokenizer, an ORT session on its exported encoder, the graph path, G)."""
    variant = request.param
    checkpoint = build_tiny(tmp_path_factory.mktemp(f"tiny{variant}"), seed=11 + variant, variant=variant)
    speech_tokenizer = load_reference(checkpoint).model.speech_tokenizer
    path = checkpoint / "speech_encoder.onnx"
    export_speech_encoder(speech_tokenizer, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return speech_tokenizer, session, path, VARIANTS[variant].groups


def test_graph_names_shapes_and_dtypes(encoder):
    _, _, path, groups = encoder
    model = onnx.load(str(path))
    (pcm,), (codes,) = model.graph.input, model.graph.output

    def dims(value):
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    assert (pcm.name, pcm.type.tensor_type.elem_type) == (PCM, onnx.TensorProto.FLOAT)
    assert (codes.name, codes.type.tensor_type.elem_type) == (CODES, onnx.TensorProto.INT64)
    assert dims(pcm)[0] == 1 and isinstance(dims(pcm)[1], str)
    assert dims(codes)[0] == 1 and isinstance(dims(codes)[1], str) and dims(codes)[2] == groups
    assert not {"Loop", "If", "Scan"} & {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("num_samples", LENGTHS, ids=lambda n: f"{n}samples")
def test_codes_equal_library(encoder, num_samples):
    speech_tokenizer, session, _, groups = encoder
    pcm = speech_like(num_samples, seed=num_samples % 7)
    want = speech_tokenizer.encode(pcm, sr=SAMPLE_RATE).audio_codes[0].numpy()  # [T, G]
    (got,) = session.run([CODES], {PCM: pcm[None]})
    frames = math.ceil(num_samples / SAMPLES_PER_FRAME)
    assert want.shape == (frames, groups)
    assert got.dtype == np.int64 and got.shape == (1, frames, groups)
    differing = np.flatnonzero(np.any(got[0] != want, axis=-1))
    assert differing.size == 0, f"{differing.size} of {frames} frames differ, first at {differing[:5]}"
