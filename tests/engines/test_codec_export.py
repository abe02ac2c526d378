"""The vocoder port and its streaming ONNX graph against qwen-tts's own 12 Hz decoder, on tiny random
checkpoints.

Each checkpoint is a `Qwen3TTSTokenizerV2Model` built with qwen-tts's classes, every parameter
re-drawn from a seeded generator (the default init has all-zero codebooks, so the output would not
depend on the codes, and zero SnakeBeta parameters), and saved with `save_pretrained` as
`<dir>/speech_tokenizer/`, the layout of a real checkpoint. The gains keep the waveform off the
+-1 clamp and make it depend on the codes, so a wrong sliding window shows up well above tolerance.

The graph is exported once per checkpoint (the `vocoder` fixture, ~25 s each). Streams are fed to
it the way the runtime does: a few new frames per call, state_out fed back as state_in.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.torch import load_file, save_file

from engines.qwen3_tts.codec import Codec, CodecConfig, load_codec, state_specs
from engines.qwen3_tts.codec_export import export_vocoder
from engines.qwen3_tts.reference import import_qwen_tts

SAMPLES_PER_FRAME = 1920
CODEBOOK_SIZE = 64
WINDOWS = (1, 4, 4, 3, 1, 4)  # frames per call, cycled; irregular, as the runtime's windows are
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


@pytest.fixture(scope="module")
def vocoder(checkpoint, tmp_path_factory) -> tuple[Path, ort.InferenceSession, dict]:
    """(graph path, an ORT session on it, the manifest entry export_vocoder returned)."""
    root, _ = checkpoint
    path = tmp_path_factory.mktemp("vocoder") / "vocoder.onnx"
    start = time.perf_counter()
    manifest = export_vocoder(root, path)  # also checks the graph's dims and streams ORT vs torch
    print(f"export {time.perf_counter() - start:.1f} s")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return path, ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), manifest


def _fresh_state(manifest: dict, batch: int) -> list[np.ndarray]:
    return [np.zeros((batch, *entry["shape"]), dtype=np.float32) for entry in manifest["state"]]


def _decode(vocoder, codes: torch.Tensor, start, state: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One graph call: codes [B, G, F] of the new frames, start [B] (or one int for all rows)."""
    _, session, manifest = vocoder
    batch = codes.shape[0]
    feeds = {"codes": codes.numpy(), "start": np.broadcast_to(np.asarray(start, dtype=np.int64), (batch,)).copy()}
    feeds.update((entry["input"], s) for entry, s in zip(manifest["state"], state))
    pcm, *new_state = session.run(manifest["outputs"], feeds)
    assert [s.shape for s in new_state] == [s.shape for s in state]  # ping-pong buffers
    return pcm, new_state


def _stream(vocoder, codes: torch.Tensor, start=0, state=None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Decodes codes [B, G, F] in WINDOWS-sized calls (the last one partial), carrying the state."""
    state = _fresh_state(vocoder[2], codes.shape[0]) if state is None else state
    chunks, done, call = [], 0, 0
    while done < codes.shape[-1]:
        frames = min(WINDOWS[call % len(WINDOWS)], codes.shape[-1] - done)
        pcm, state = _decode(vocoder, codes[..., done : done + frames], np.asarray(start) + done, state)
        chunks.append(pcm)
        done, call = done + frames, call + 1
    return np.concatenate(chunks, axis=1), state


def test_graph_contract(checkpoint, vocoder):
    """Names, dtypes, dynamic B and F, and state shapes [B, *state_specs] on both sides."""
    root, _ = checkpoint
    config = CodecConfig.from_checkpoint(root)
    path, _, manifest = vocoder
    specs = state_specs(config)
    count = len(specs)
    assert count == 2 * TINY_DECODER["num_hidden_layers"] + 21  # KV per layer + 21 conv tails
    assert manifest["inputs"] == ["codes", "start", *(f"state_in_{i}" for i in range(count))]
    assert manifest["outputs"] == ["pcm", *(f"state_out_{i}" for i in range(count))]
    assert [entry["shape"] for entry in manifest["state"]] == [list(shape) for _, shape in specs]
    assert specs[1] == ("pre_transformer.layers.0.self_attn.keys", (4, 71, 8))  # [Hkv, window - 1, D]

    graph = onnx.load(str(path)).graph
    assert not any(node.domain not in ("", "ai.onnx") for node in graph.node)  # standard ops only
    values = {v.name: v.type.tensor_type for v in (*graph.input, *graph.output)}
    assert [v.name for v in graph.input] == manifest["inputs"]
    assert [v.name for v in graph.output] == manifest["outputs"]

    def dims(name: str) -> list:
        return [d.dim_param or d.dim_value for d in values[name].shape.dim]

    batch, groups, frames = dims("codes")
    assert isinstance(batch, str) and isinstance(frames, str) and batch != frames
    assert groups == config.num_quantizers
    assert values["codes"].elem_type == values["start"].elem_type == onnx.TensorProto.INT64
    assert dims("start") == [batch]
    assert values["pcm"].elem_type == onnx.TensorProto.FLOAT
    assert dims("pcm")[0] == batch and isinstance(dims("pcm")[1], str)
    for entry in manifest["state"]:
        for name in (entry["input"], entry["output"]):
            assert values[name].elem_type == onnx.TensorProto.FLOAT
            assert dims(name) == [batch, *entry["shape"]]
    print(f"G={config.num_quantizers}: {len(graph.node)} nodes, {count} state tensors")


@pytest.mark.parametrize("batch", [1, 2])
def test_fresh_stream_is_whole_decode(checkpoint, vocoder, batch):
    """start = 0 and zero state: one call decodes a whole utterance, as the reference does."""
    _, decoder = checkpoint
    groups = decoder.config.num_quantizers
    state = _fresh_state(vocoder[2], batch)
    for frames in (1, 3, 80):  # 80 > the 72-frame window
        codes = _codes(batch, groups, frames, seed=10 * batch + frames)
        pcm, _ = _decode(vocoder, codes, 0, state)
        expected = _reference(decoder, codes).numpy()
        assert pcm.shape == (batch, frames * SAMPLES_PER_FRAME)
        error = float(np.abs(pcm - expected).max())
        print(f"G={groups} B={batch} F={frames}: one call vs reference max |err| {error:.3g}")
        assert error <= 1e-5


def test_streamed_equals_whole_decode(checkpoint, vocoder):
    """150 frames (twice the attention window) in calls of 1-4 frames, ending with a partial
    window, carrying the state: the reference's whole-utterance waveform, to float noise."""
    _, decoder = checkpoint
    groups = decoder.config.num_quantizers
    codes = _codes(1, groups, 150, seed=150)
    expected = _reference(decoder, codes).numpy()
    pcm, _ = _stream(vocoder, codes)
    error = float(np.abs(pcm - expected).max())
    print(f"G={groups} F=150 streamed in windows {WINDOWS}: max |err| {error:.3g} (peak {np.abs(expected).max():.3f})")
    assert error <= 1e-5


def test_batched_streams_equal_single(checkpoint, vocoder):
    """Two streams at different points share calls: stream a has decoded 40 frames alone, stream b
    starts fresh, then 60 frames of each go through together, rows at different starts."""
    _, decoder = checkpoint
    groups = decoder.config.num_quantizers
    a, b = _codes(1, groups, 100, seed=1), _codes(1, groups, 60, seed=2)
    head, state_a = _stream(vocoder, a[..., :40])
    state = [np.concatenate((sa, sb)) for sa, sb in zip(state_a, _fresh_state(vocoder[2], 1))]
    both, _ = _stream(vocoder, torch.cat((a[..., 40:], b)), start=np.array([40, 0]), state=state)
    alone_b, _ = _stream(vocoder, b)
    pcm_a = np.concatenate((head[0], both[0]))
    error_a = float(np.abs(pcm_a - _reference(decoder, a).numpy()[0]).max())
    error_b = float(np.abs(both[1] - _reference(decoder, b).numpy()[0]).max())
    print(f"G={groups} batched vs reference: a {error_a:.3g}, b {error_b:.3g}; "
          f"b batched vs alone {np.abs(both[1] - alone_b[0]).max():.3g}")
    assert max(error_a, error_b) <= 1e-5
    assert np.abs(both[1] - alone_b[0]).max() <= 1e-5


def test_the_state_a_stream_carries_is_what_the_graph_and_the_docs_say(checkpoint, vocoder):
    """Every state tensor the exported graph takes is one of `state_specs`, and at the released 0.6B
    decoder's dimensions a stream carries what docs/artifact.md says (37 tensors, 5,193,984 bytes,
    4,653,056 of them keys and values)."""
    path, _, manifest = vocoder
    tiny = [shape for _, shape in state_specs(CodecConfig.from_checkpoint(checkpoint[0]))]
    model = onnx.load(str(path), load_external_data=False)
    shapes = [tuple(d.dim_value for d in i.type.tensor_type.shape.dim[1:]) for i in model.graph.input
              if i.name.startswith("state_in_")]
    assert shapes == [tuple(s["shape"]) for s in manifest["state"]] == tiny and len(tiny) > 3
    real = CodecConfig(
        codebook_dim=512, codebook_size=2048, latent_dim=1024, hidden_size=512, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, head_dim=64, intermediate_size=1024, sliding_window=72,
        rope_theta=10000.0, rms_norm_eps=1e-5, layer_scale_initial_scale=0.01, num_quantizers=16,
        upsample_rates=(8, 5, 4, 3), upsampling_ratios=(2, 2), decoder_dim=1536, output_sample_rate=24000,
        decode_upsample_rate=1920, front_end="rvq",
    )
    specs = state_specs(real)
    kv = sum(math.prod(shape) for key, shape in specs if key.endswith(("keys", "values")))
    assert (len(specs), 4 * sum(math.prod(shape) for _, shape in specs), 4 * kv) == (37, 5_193_984, 4_653_056)


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
