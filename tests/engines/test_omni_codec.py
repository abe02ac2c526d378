"""Qwen3-Omni's code2wav as the shared streaming codec: equal to the library's whole decode over the
samples it returns (1920 x F - 555), streamed in windows equal to whole, and exported to the
streaming vocoder graph that ONNX Runtime runs, on tiny random checkpoints of three shapes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engines.qwen3_omni.codec import load_omni_codec
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_omni.tiny import VARIANTS, build_model
from engines.qwen3_tts.codec_export import export_codec

TOLERANCE = 1e-4  # the bound on PCM against the library


@pytest.fixture(scope="module", params=range(len(VARIANTS)))
def omni(request, tmp_path_factory):
    model = build_model(seed=10 + request.param, variant=request.param)
    path = tmp_path_factory.mktemp(f"omni{request.param}")
    model.save_pretrained(path)
    config = Qwen3OmniConfig.from_checkpoint(path).codec
    codec = load_omni_codec(path, config)
    return model, config, codec


@pytest.mark.parametrize("frames", [1, 2, 9])
def test_the_whole_decode_equals_the_library(omni, frames):
    model, config, codec = omni
    seeded = torch.Generator().manual_seed(frames)
    codes = torch.randint(0, config.codebook_size, (2, config.num_quantizers, frames), generator=seeded)
    with torch.no_grad():
        want = model.code2wav(codes)[:, 0]
        got = codec(codes)[:, config.lead_samples:]
    assert config.lead_samples == 555 and want.shape == got.shape == (2, frames * 1920 - 555)
    assert want.abs().max() > 1e-3 and (want - got).abs().max() <= TOLERANCE


def test_a_stream_in_windows_equals_the_whole_decode(omni):
    _, config, codec = omni
    seeded = torch.Generator().manual_seed(1)
    codes = torch.randint(0, config.codebook_size, (1, config.num_quantizers, 10), generator=seeded)
    with torch.no_grad():
        whole = codec(codes)
        state, start, parts = codec.fresh_state(1), 0, []
        for n in (1, 3, 2, 4):
            pcm, state = codec.decode(codes[..., start:start + n], torch.tensor([start]), state)
            parts.append(pcm)
            start += n
    assert (torch.cat(parts, dim=1) - whole).abs().max() <= 1e-5


def test_the_streaming_graph_exports_and_runs_on_onnx_runtime(omni, tmp_path):
    _, config, codec = omni
    manifest = export_codec(codec, tmp_path / "vocoder.onnx")  # streams on ORT against torch, raises if off
    assert manifest["inputs"][:2] == ["codes", "start"] and len(manifest["state"]) == len(codec.state_specs())
