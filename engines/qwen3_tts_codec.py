"""Qwen3-TTS 12 Hz speech-tokenizer decoder (the vocoder), written for export.

A readable port of qwen-tts 0.1.1 `Qwen3TTSTokenizerV2Decoder.forward`
(`qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`):

  codes [B, G, F] -> codebook sum [B, codebook_dim, F] -> causal conv -> sliding-window causal
  transformer -> ConvNeXt upsampler (x4) -> SnakeBeta conv decoder (x480) -> clamp -> pcm [B, F * 1920]

Everything is causal, so frame t of the output depends only on codes 0..t. Shapes are written with
integer arithmetic only, so the exported graph has dynamic B and F and an output of exactly
F * samples_per_frame samples. Attention is plain MatMul/Softmax with a Where mask (no fused
attention ops), so the graph stays TensorRT-friendly.

Reads top to bottom: config, convolution blocks, transformer blocks, model, loading, ONNX export.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from safetensors import safe_open
from torch import nn
from torch.nn import functional as nnf

NUM_SEMANTIC_QUANTIZERS = 1  # the reference hard-codes one semantic codebook (group 0)
CODEBOOK_EPS = 1e-5  # EuclideanCodebook clamps cluster_usage to this before dividing
SNAKE_EPS = 1e-9  # SnakeBeta's guard against dividing by exp(beta) = 0


# ----------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class CodecConfig:
    """The `decoder_config` part of `speech_tokenizer/config.json` plus the output audio rate.

    Defaults are those of `Qwen3TTSTokenizerV2DecoderConfig`, used where a checkpoint omits a key.
    """

    codebook_dim: int
    """Width of the summed codebook vectors; each codebook stores codebook_dim // 2 wide entries."""
    codebook_size: int = 2048
    """Entries per codebook (codes are 0..codebook_size-1)."""
    latent_dim: int = 1024
    """Channels of the conv path around the transformer."""
    hidden_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    """Per-head width; the reference falls back to hidden_size // num_attention_heads."""
    intermediate_size: int = 3072
    sliding_window: int = 72
    """Keys per query, the query's own frame included (HF: kv_idx > q_idx - sliding_window)."""
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    """Code groups G per frame: 1 semantic + G-1 acoustic."""
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    """Strides of the SnakeBeta decoder blocks."""
    upsampling_ratios: tuple[int, ...] = (2, 2)
    """Strides of the ConvNeXt upsampler that follows the transformer."""
    decoder_dim: int = 1536
    """Channels entering the first decoder block; each block halves them."""
    max_position_embeddings: int = 8000
    """Not a limit here: default RoPE is computed for any position, as in the reference."""
    output_sample_rate: int = 24000
    """Hz."""
    decode_upsample_rate: int = 1920
    """Output samples per code frame, as the checkpoint declares it."""

    def __post_init__(self) -> None:
        if self.samples_per_frame != self.decode_upsample_rate:
            raise ValueError(
                f"decode_upsample_rate={self.decode_upsample_rate} but the strides "
                f"{self.upsampling_ratios} x {self.upsample_rates} give {self.samples_per_frame}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.num_quantizers <= NUM_SEMANTIC_QUANTIZERS:
            raise ValueError(f"num_quantizers={self.num_quantizers} leaves no acoustic codebook")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError("decoder_dim must halve evenly through every decoder block")

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> CodecConfig:
        """Reads `<checkpoint_dir>/speech_tokenizer/config.json`."""
        path = Path(checkpoint_dir) / "speech_tokenizer" / "config.json"
        top = json.loads(path.read_text())
        if "decoder_config" not in top:
            raise ValueError(f"{path}: no decoder_config")
        dec = top["decoder_config"]
        # Settings this port does not implement must fail here rather than decode wrongly.
        for key, supported in (("attention_bias", False), ("hidden_act", "silu"), ("rope_scaling", None)):
            if dec.get(key, supported) != supported:
                raise ValueError(f"{path}: decoder_config.{key}={dec[key]!r} is not supported")
        if "codebook_dim" not in dec:
            raise ValueError(f"{path}: decoder_config.codebook_dim is missing")
        values: dict[str, object] = {}
        for f in fields(cls):
            source = top if f.name in ("output_sample_rate", "decode_upsample_rate") else dec
            if f.name in source:
                value = source[f.name]
                values[f.name] = tuple(value) if isinstance(value, list) else value
        if "head_dim" not in dec:  # the reference's fallback
            values["head_dim"] = dec.get("hidden_size", cls.hidden_size) // dec.get(
                "num_attention_heads", cls.num_attention_heads
            )
        return cls(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ convolution blocks


class CausalConv1d(nn.Module):
    """Conv1d padded on the left only: output t sees inputs <= t and the length is kept.

    Every causal conv of this decoder has stride 1, where the reference's extra right padding
    (ceil(L / stride) * stride - L) is always 0, so the padding is the constant (k - 1) * dilation.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.left_pad = (kernel_size - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T]
        return self.conv(nnf.pad(x, (self.left_pad, 0)))


class CausalConvTranspose1d(nn.Module):
    """Transposed conv upsampling T -> T * stride; the kernel's overhang is cut on the right only."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T * stride]
        length = x.shape[-1] * self.stride
        return self.conv(x)[..., :length]  # conv gives (T - 1) * stride + kernel_size


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / e^beta per channel (alpha, beta are stored as logarithms)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        alpha = self.alpha.exp()[None, :, None]  # [1, C, 1]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + SNAKE_EPS)) * torch.sin(x * alpha).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(channels)
        self.conv1 = CausalConv1d(channels, channels, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(channels)
        self.conv2 = CausalConv1d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    """SnakeBeta, upsample by `rate` while halving channels, then three dilated residual units."""

    def __init__(self, in_channels: int, out_channels: int, rate: int):
        super().__init__()
        self.block = nn.Sequential(
            SnakeBeta(in_channels),
            CausalConvTranspose1d(in_channels, out_channels, kernel_size=2 * rate, stride=rate),
            *(ResidualUnit(out_channels, dilation) for dilation in (1, 3, 9)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T * rate]
        return self.block(x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.dwconv = CausalConv1d(channels, channels, kernel_size=7, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.pwconv1 = nn.Linear(channels, 4 * channels)
        self.pwconv2 = nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        h = self.dwconv(x).transpose(1, 2)  # [B, T, C]
        h = self.pwconv2(nnf.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class QuantizerDecoder(nn.Module):
    """Codes -> summed codebook vectors: group 0 through the semantic projection, groups 1..G-1
    summed and then through the acoustic projection.

    `codebooks` holds all G codebooks stacked, already divided as embedding_sum / cluster_usage
    (see `load_codec`), so one Gather looks up every group at once.
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        entry_dim = config.codebook_dim // 2
        self.codebook_size = config.codebook_size
        self.register_buffer("codebooks", torch.zeros(config.num_quantizers * config.codebook_size, entry_dim))
        self.register_buffer(
            "group_offsets", torch.arange(config.num_quantizers) * config.codebook_size, persistent=False
        )
        self.semantic_proj = nn.Conv1d(entry_dim, config.codebook_dim, 1, bias=False)
        self.acoustic_proj = nn.Conv1d(entry_dim, config.codebook_dim, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, G, F] -> [B, codebook_dim, F]
        # The reference's decode() clamps padding (-1) to 0; clamping both ends also keeps the
        # Gather in bounds on backends that do not check indices.
        codes = codes.clamp(0, self.codebook_size - 1)
        vectors = nnf.embedding(codes + self.group_offsets[None, :, None], self.codebooks)  # [B, G, F, E]
        vectors = vectors.transpose(2, 3)  # [B, G, E, F]
        semantic = self.semantic_proj(vectors[:, 0])
        acoustic = self.acoustic_proj(vectors[:, NUM_SEMANTIC_QUANTIZERS:].sum(dim=1))
        return semantic + acoustic


# ------------------------------------------------------------------------------ transformer blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial_scale: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rope_tables(num_frames: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [F, head_dim] for positions 0..F-1 (HF default RoPE, halves duplicated)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)  # [D/2]
    positions = torch.arange(num_frames, dtype=torch.int64).float()  # [F]
    freqs = positions[:, None] * inv_freq[None, :]  # [F, D/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [F, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, H, F, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def sliding_window_mask(num_frames: int, window: int) -> torch.Tensor:
    """[F, F] bool, True where query i may attend key j: j <= i and i - j < window.

    transformers 4.57.3 allows kv_idx > q_idx - window, so a frame sees itself and the window - 1
    frames before it (72 keys, 71 of them earlier, for the released config).
    """
    frames = torch.arange(num_frames)
    distance = frames[:, None] - frames[None, :]  # [F, F] query minus key
    return (distance >= 0) & (distance < window)


class Attention(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, frames, _ = x.shape  # [B, F, hidden]
        q = self.q_proj(x).view(batch, frames, self.heads, self.head_dim).transpose(1, 2)  # [B, H, F, D]
        k = self.k_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, F, D]
        v = self.v_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)  # [B, H, F, D]
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.head_dim**-0.5  # [B, H, F, F]
        # Every row keeps its own frame, so no row is all -inf.
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(batch, frames, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nnf.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """latent_dim -> hidden_size, causal sliding-window layers, final norm, back to latent_dim."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, F, latent] -> [B, F, latent]
        frames = x.shape[1]
        cos, sin = rope_tables(frames, self.config.head_dim, self.config.rope_theta)  # [F, D]
        mask = sliding_window_mask(frames, self.config.sliding_window)  # [F, F]
        x = self.input_proj(x)  # [B, F, hidden]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output_proj(self.norm(x))


# ------------------------------------------------------------------------------------------ model


class Codec(nn.Module):
    """codes [B, G, F] int64 -> pcm [B, F * samples_per_frame] float32 in [-1, 1].

    Submodule names follow the checkpoint's `decoder.*` keys, except the quantizer (see
    `load_codec`).
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.quantizer = QuantizerDecoder(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = Transformer(config)
        self.upsample = nn.Sequential(
            *(
                nn.Sequential(
                    CausalConvTranspose1d(config.latent_dim, config.latent_dim, kernel_size=ratio, stride=ratio),
                    ConvNeXtBlock(config.latent_dim),
                )
                for ratio in config.upsampling_ratios
            )
        )
        channels = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.Sequential(
            CausalConv1d(config.latent_dim, channels[0], kernel_size=7),
            *(DecoderBlock(channels[i], channels[i + 1], rate) for i, rate in enumerate(config.upsample_rates)),
            SnakeBeta(channels[-1]),
            CausalConv1d(channels[-1], 1, kernel_size=7),
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, G, F] -> [B, F * samples_per_frame]
        x = self.quantizer(codes)  # [B, codebook_dim, F]
        x = self.pre_conv(x).transpose(1, 2)  # [B, F, latent]
        x = self.pre_transformer(x).transpose(1, 2)  # [B, latent, F]
        x = self.upsample(x)  # [B, latent, F * prod(upsampling_ratios)]
        pcm = self.decoder(x)  # [B, 1, F * samples_per_frame]
        return pcm.squeeze(1).clamp(-1.0, 1.0)


# ---------------------------------------------------------------------------------------- loading


def load_codec(checkpoint_dir: str | Path) -> tuple[CodecConfig, Codec]:
    """Builds the decoder from `<checkpoint_dir>/speech_tokenizer/{config.json,model.safetensors}`.

    Strict both ways: every tensor the decoder needs must be present with the expected shape, and
    every `decoder.*` tensor must be used (other than the quantizer's encode-only input_proj); the
    errors name the checkpoint keys. The Mimi encoder's tensors are ignored. Weights load as float32.
    """
    config = CodecConfig.from_checkpoint(checkpoint_dir)
    path = Path(checkpoint_dir) / "speech_tokenizer" / "model.safetensors"
    codec = Codec(config)
    used: set[str] = set()
    with safe_open(str(path), framework="pt") as f:
        available = set(f.keys())

        def take(key: str) -> torch.Tensor:
            if key not in available:
                raise ValueError(f"{path}: missing tensor {key!r} needed by the vocoder")
            used.add(key)
            return f.get_tensor(key).float()

        state = {}
        for name, expected in codec.state_dict().items():
            key, tensor = _checkpoint_tensor(name, take, config)
            if tensor.shape != expected.shape:
                raise ValueError(f"{path}: {key!r} has shape {tuple(tensor.shape)}, expected {tuple(expected.shape)}")
            state[name] = tensor
    unused = sorted(k for k in available - used - _ENCODE_ONLY if k.startswith("decoder."))
    if unused:
        raise ValueError(f"{path}: decoder tensors this port does not use: {', '.join(unused)}")
    codec.load_state_dict(state, strict=True)
    return config, codec.eval()


_QUANTIZER = "decoder.quantizer"
_RENAMED = {
    "quantizer.semantic_proj.weight": f"{_QUANTIZER}.rvq_first.output_proj.weight",
    "quantizer.acoustic_proj.weight": f"{_QUANTIZER}.rvq_rest.output_proj.weight",
}
_ENCODE_ONLY = {f"{_QUANTIZER}.rvq_first.input_proj.weight", f"{_QUANTIZER}.rvq_rest.input_proj.weight"}


def _checkpoint_tensor(
    name: str, take: Callable[[str], torch.Tensor], config: CodecConfig
) -> tuple[str, torch.Tensor]:
    """The checkpoint key behind one of our state-dict entries, and its value."""
    if name == "quantizer.codebooks":
        return f"{_QUANTIZER}.*._codebook", _stacked_codebooks(take, config)
    key = _RENAMED.get(name, f"decoder.{name}")
    return key, take(key)


def _stacked_codebooks(take: Callable[[str], torch.Tensor], config: CodecConfig) -> torch.Tensor:
    """[G * V, E]: codebook g as the reference computes it, embedding_sum / cluster_usage."""
    books = []
    for group in range(config.num_quantizers):
        if group < NUM_SEMANTIC_QUANTIZERS:
            prefix = f"{_QUANTIZER}.rvq_first.vq.layers.{group}._codebook"
        else:
            prefix = f"{_QUANTIZER}.rvq_rest.vq.layers.{group - NUM_SEMANTIC_QUANTIZERS}._codebook"
        usage = take(f"{prefix}.cluster_usage")  # [V]
        books.append(take(f"{prefix}.embedding_sum") / usage.clamp(min=CODEBOOK_EPS)[:, None])  # [V, E]
    return torch.cat(books)


# ------------------------------------------------------------------------------------ ONNX export

INPUT_NAME = "codes"  # [B, G, F] int64
OUTPUT_NAME = "pcm"  # [B, F * samples_per_frame] float32
EXPORT_CHECK_TOLERANCE = 1e-3  # ORT vs torch on the exported weights; measured errors are ~1e-5


def export_vocoder(checkpoint_dir: str | Path, out_path: str | Path, opset: int = 18) -> None:
    """Writes the `vocoder` graph of docs/artifact.md for a checkpoint (see `export_codec`)."""
    _, codec = load_codec(checkpoint_dir)
    export_codec(codec, out_path, opset)


def export_codec(codec: Codec, out_path: str | Path, opset: int = 18) -> float:
    """Exports `codec` as one self-contained ONNX file with dynamic B and F, checks that B and F
    really are dynamic, and runs the graph on ONNX Runtime against torch (B=1, F=1 and B=2, F=3,
    random codes). Raises if they differ by more than EXPORT_CHECK_TOLERANCE; returns the error.

    The example input has B = 2 and F = 3: torch.export specialises a dimension whose example
    size is 1 and the exporter then silently writes it as static.
    """
    config = codec.config
    example = torch.zeros(2, config.num_quantizers, 3, dtype=torch.int64)  # [B, G, F]
    batch, frames = torch.export.Dim("batch"), torch.export.Dim("frames")
    with torch.no_grad():
        torch.onnx.export(
            codec.eval(),
            (example,),
            str(out_path),
            dynamo=True,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: batch, 2: frames},),
            external_data=False,
        )
    _check_dynamic(onnx.load(str(out_path), load_external_data=False), config)
    generator = torch.Generator().manual_seed(0)
    cases = [
        torch.randint(0, config.codebook_size, (b, config.num_quantizers, f), generator=generator)
        for b, f in ((1, 1), (2, 3))
    ]
    error = verify_onnx(codec, out_path, cases)
    if error > EXPORT_CHECK_TOLERANCE:
        raise RuntimeError(f"{out_path}: ONNX Runtime differs from torch by {error:.3g}")
    return error


def _check_dynamic(model: onnx.ModelProto, config: CodecConfig) -> None:
    """codes must be [dynamic, G, dynamic] and pcm [dynamic, dynamic]."""

    def dims(values: Sequence[onnx.ValueInfoProto], name: str) -> list[str | int]:
        (value,) = [v for v in values if v.name == name]
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    codes, pcm = dims(model.graph.input, INPUT_NAME), dims(model.graph.output, OUTPUT_NAME)
    ok = len(codes) == 3 and len(pcm) == 2 and codes[1] == config.num_quantizers
    if not ok or not all(isinstance(d, str) for d in (codes[0], codes[2], *pcm)):
        raise RuntimeError(
            f"exported shapes are codes {codes}, pcm {pcm}; expected [B, {config.num_quantizers}, F], [B, P]"
        )


def verify_onnx(codec: Codec, onnx_path: str | Path, cases: Sequence[torch.Tensor]) -> float:
    """Max |ORT - torch| over code tensors [B, G, F]; raises if an output shape differs."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for codes in cases:
        with torch.no_grad():
            expected = codec(codes).numpy()  # [B, P]
        (pcm,) = session.run([OUTPUT_NAME], {INPUT_NAME: codes.numpy()})
        if pcm.shape != expected.shape:
            raise RuntimeError(f"ONNX pcm {pcm.shape} != torch {expected.shape} for codes {tuple(codes.shape)}")
        worst = max(worst, float(np.abs(pcm - expected).max()))
    return worst
