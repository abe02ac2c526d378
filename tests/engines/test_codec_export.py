"""The vocoder port and its ONNX graph against qwen-tts's own 12 Hz decoder, on tiny random checkpoints.

Each checkpoint is a `Qwen3TTSTokenizerV2Model` built with qwen-tts's classes, every parameter
re-drawn from a seeded generator (the default init has all-zero codebooks, so the output would not
depend on the codes, and zero SnakeBeta parameters), and saved with `save_pretrained` as
`<dir>/speech_tokenizer/`, the layout of a real checkpoint. The gains keep the waveform off the
+-1 clamp and make it depend on the codes, so a wrong sliding window shows up well above tolerance.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from engines.qwen3_tts_codec import Codec, CodecConfig, export_vocoder, load_codec  # noqa: E402
from engines.reference import import_qwen_tts  # noqa: E402

SAMPLES_PER_FRAME = 1920
CODEBOOK_SIZE = 64
TINY_DECODER = dict(
    codebook_size=CODEBOOK_SIZE, codebook_dim=32, hidden_size=32, latent_dim=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, decoder_dim=64, sliding_window=72,
    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
)
# Only present so that save_pretrained writes a complete tokenizer; the vocoder never reads it.
TINY_MIMI_ENCODER = dict(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
    intermediate_size=64, num_filters=4, codebook_size=16, codebook_dim=16, num_quantizers=4,
    upsampling_ratios=[8, 5, 4, 3], sliding_window=16, max_position_embeddings=64, upsample_groups=32,
)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter. The conv decoder gets smaller gains than the layers before it:
    each of its blocks adds SnakeBeta's positive sin^2 term, and with the front's gains the
    waveform would grow past the clamp."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if name.endswith("cluster_usage"):
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=generator))  # EMA counts are > 0
            elif name.endswith("embedding_sum"):
                p.copy_(noise)
            elif name.endswith((".alpha", ".beta")):
                p.copy_(0.3 * noise)  # SnakeBeta log-frequency / log-magnitude
            elif name.endswith(("scale", "gamma")):
                p.copy_(noise)  # LayerScale / ConvNeXt gamma: let every residual branch count
            elif p.dim() == 1:
                p.copy_(0.02 * noise + (1.0 if name.endswith("norm.weight") else 0.0))
            else:
                gain = 0.5 if name.startswith("decoder.decoder.") else 2.0
                p.copy_(gain * noise / math.sqrt(p[0].numel()))


@pytest.fixture(scope="module", params=[4, 16], ids=lambda q: f"G{q}")
def checkpoint(request, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """(checkpoint dir, the reference `Qwen3TTSTokenizerV2Decoder` holding the same weights)."""
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    config = Qwen3TTSTokenizerV2Config(
        encoder_config=TINY_MIMI_ENCODER,
        decoder_config=dict(TINY_DECODER, num_quantizers=request.param),
        encoder_valid_num_quantizers=4,
    )
    model = Qwen3TTSTokenizerV2Model(config).eval()
    _randomize(model, seed=request.param)
    root = tmp_path_factory.mktemp(f"codec_g{request.param}")
    model.save_pretrained(root / "speech_tokenizer")
    return root, model.decoder


def _codes(batch: int, groups: int, frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK_SIZE, (batch, groups, frames), generator=generator)  # [B, G, F]


def _write_copy(root: Path, dest: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A checkpoint at `dest` with `root`'s speech-tokenizer config and the given tensors."""
    (dest / "speech_tokenizer").mkdir()
    config = (root / "speech_tokenizer" / "config.json").read_bytes()
    (dest / "speech_tokenizer" / "config.json").write_bytes(config)
    save_file(tensors, str(dest / "speech_tokenizer" / "model.safetensors"))


def _reference(decoder: torch.nn.Module, codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return decoder(codes).squeeze(1)  # [B, F * 1920]


def test_config_read_from_checkpoint(checkpoint):
    root, decoder = checkpoint
    config = CodecConfig.from_checkpoint(root)
    assert config.num_quantizers == decoder.config.num_quantizers
    assert config.head_dim == 8  # no head_dim key: hidden_size // num_attention_heads
    assert config.sliding_window == 72
    assert config.samples_per_frame == SAMPLES_PER_FRAME == config.decode_upsample_rate


@pytest.mark.parametrize("frames", [1, 7, 80])  # 80 > the 72-frame window
def test_port_matches_reference(checkpoint, frames):
    root, decoder = checkpoint
    config, codec = load_codec(root)
    codes = _codes(2, config.num_quantizers, frames, seed=frames)
    expected = _reference(decoder, codes)
    with torch.no_grad():
        pcm = codec(codes)
    assert pcm.shape == (2, frames * SAMPLES_PER_FRAME)
    error = (pcm - expected).abs().max().item()
    print(f"G={config.num_quantizers} F={frames}: port vs reference max |err| {error:.3g}")
    assert error <= 1e-5


def test_sliding_window_off_by_one_is_visible(checkpoint):
    """The window semantics matter at this tolerance: 71 or 73 keys per query miss the reference."""
    root, decoder = checkpoint
    config, codec = load_codec(root)
    codes = _codes(1, config.num_quantizers, 80, seed=80)
    expected = _reference(decoder, codes)
    for window in (71, 73):
        other = Codec(dataclasses.replace(config, sliding_window=window))
        other.load_state_dict(codec.state_dict())
        with torch.no_grad():
            assert (other.eval()(codes) - expected).abs().max().item() > 1e-4


def test_onnx_matches_reference(checkpoint, tmp_path):
    root, decoder = checkpoint
    config = CodecConfig.from_checkpoint(root)
    path = tmp_path / "vocoder.onnx"
    start = time.perf_counter()
    export_vocoder(root, path)  # also checks the graph's dynamic dims and ORT vs torch
    seconds = time.perf_counter() - start

    graph = onnx.load(str(path)).graph
    (codes_info,), (pcm_info,) = graph.input, graph.output
    assert (codes_info.name, pcm_info.name) == ("codes", "pcm")
    assert codes_info.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert pcm_info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert not any(node.domain not in ("", "ai.onnx") for node in graph.node)  # standard ops only
    print(f"G={config.num_quantizers}: export {seconds:.1f} s, {len(graph.node)} nodes")

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases = [_codes(batch, config.num_quantizers, frames, seed=10 * batch + frames)
             for batch in (1, 2) for frames in (1, 3, 80)]
    for codes in cases:
        (pcm,) = session.run(["pcm"], {"codes": codes.numpy()})
        expected = _reference(decoder, codes).numpy()
        batch, _, frames = codes.shape
        assert pcm.shape == (batch, frames * SAMPLES_PER_FRAME)
        error = float(np.abs(pcm - expected).max())
        print(f"G={config.num_quantizers} B={batch} F={frames}: ORT vs reference max |err| {error:.3g}")
        assert error <= 1e-4


@pytest.mark.parametrize(
    "key",
    [
        "decoder.pre_transformer.layers.1.mlp.up_proj.weight",
        "decoder.quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum",
        "decoder.decoder.4.block.3.act1.alpha",
    ],
)
def test_missing_key_names_the_key(checkpoint, tmp_path, key):
    root, _ = checkpoint
    tensors = load_file(str(root / "speech_tokenizer" / "model.safetensors"))
    del tensors[key]
    _write_copy(root, tmp_path, tensors)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_codec(tmp_path)


def test_unused_decoder_key_names_the_key(checkpoint, tmp_path):
    """A decoder tensor the port would silently ignore means a layout it does not implement."""
    root, _ = checkpoint
    tensors = load_file(str(root / "speech_tokenizer" / "model.safetensors"))
    tensors["decoder.pre_transformer.layers.2.mlp.up_proj.weight"] = torch.zeros(64, 32)
    _write_copy(root, tmp_path, tensors)
    with pytest.raises(ValueError, match=r"decoder\.pre_transformer\.layers\.2\.mlp\.up_proj\.weight"):
        load_codec(tmp_path)


@pytest.mark.parametrize("checkpoint", [16], indirect=True, ids=["G16"])
def test_windowed_decoding_vs_whole(checkpoint):
    """Measures (prints, does not assert) how far decoding 4 new frames at a time with C frames of
    left context, whose samples are dropped, lands from decoding all 120 frames at once.

    A window that starts before frame C has the whole prefix as context, which the whole decode
    computes exactly (the decoder is causal, asserted here), so only the windows with a full C
    frames of context are decoded, all in one batch.
    """
    root, _ = checkpoint
    config, codec = load_codec(root)
    frames, step = 120, 4
    codes = _codes(1, config.num_quantizers, frames, seed=120)
    with torch.no_grad():
        whole = codec(codes)  # [1, 120 * 1920]
        prefix = codec(codes[..., :50])
        assert (prefix - whole[:, : prefix.shape[1]]).abs().max().item() <= 1e-5
        for context in (25, 50, 72, 100):
            starts = range(step * math.ceil(context / step), frames, step)
            windows = torch.cat([codes[..., start - context : start + step] for start in starts])  # [W, G, C + 4]
            new = codec(windows)[:, context * SAMPLES_PER_FRAME :]  # [W, 4 * 1920]
            expected = torch.stack([whole[0, start * SAMPLES_PER_FRAME : (start + step) * SAMPLES_PER_FRAME]
                                    for start in starts])
            diff = (new - expected).abs().max().item()
            print(f"C={context}: windowed vs whole max |diff| {diff:.3g} (peak {whole.abs().max().item():.3f})")
