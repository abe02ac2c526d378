"""Qwen3-TTS 12 Hz speech-tokenizer decoder (the vocoder), written for export and for streaming.

A readable port of qwen-tts 0.1.1 `Qwen3TTSTokenizerV2Decoder.forward`
(`qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`):

  codes [B, G, F] -> codebook sum [B, codebook_dim, F] -> causal conv -> sliding-window causal
  transformer -> ConvNeXt upsampler (x4) -> SnakeBeta conv decoder (x480) -> clamp -> pcm [B, F * 1920]

Everything is causal, so frame t of the output depends only on codes 0..t, and a stream can be
decoded a few frames at a time with exactly the whole-utterance result, provided each call carries
what the next one needs: every causal conv keeps the tail of its input, each transposed conv the
input samples its kernel still overlaps, and each attention layer the last sliding_window - 1 keys
and values (RoPE already applied, so positions stay absolute). `Stateful` modules declare that state
and `Codec.state_slots` lists it in one fixed order; a fresh stream is all-zero state at start 0,
and the whole decode (`Codec.forward`) is exactly that. The exported graph is one such call
(`StreamingCodec`, docs/artifact.md); every state tensor has batch first and static other dims.

Shapes are written with integer arithmetic only, so the exported graph has dynamic B and F and an
output of exactly F * samples_per_frame samples. Attention is plain MatMul/Softmax with a Where mask
(no fused attention ops), so the graph stays TensorRT-friendly.

Reads top to bottom: config, stream state, convolution blocks, transformer blocks, model, loading,
ONNX export.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

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
        if self.sliding_window < 2:
            raise ValueError(f"sliding_window={self.sliding_window} leaves no history to carry")

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


# ----------------------------------------------------------------------------------- stream state


class Stateful(nn.Module):
    """A module that carries state from one decode call to the next (see `Carry`)."""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Its state tensors by kind, shapes without the batch axis; empty when it needs none."""
        raise NotImplementedError


class Carry:
    """The state of one decode call: what each stateful module kept from the previous call, and what
    it keeps for the next. Entries are keyed by (module, kind); `Codec.state_slots` fixes the order.
    """

    def __init__(self, previous: dict[tuple[nn.Module, str], torch.Tensor]):
        self.previous = previous
        self.kept: dict[tuple[nn.Module, str], torch.Tensor] = {}

    def extend(self, owner: nn.Module, kind: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The kept history followed by `x` along `dim`; its last history-length entries are kept
        for the next call (a Concat and a Slice of a small tensor in the graph)."""
        history = self.previous[(owner, kind)]
        full = torch.cat((history, x), dim=dim)
        keep = history.shape[dim]
        self.kept[(owner, kind)] = full.narrow(dim, full.shape[dim] - keep, keep)
        return full


# ------------------------------------------------------------------------------ convolution blocks


class CausalConv1d(Stateful):
    """Conv1d padded on the left only: output t sees inputs <= t and the length is kept.

    Every causal conv of this decoder has stride 1, where the reference's extra right padding
    (ceil(L / stride) * stride - L) is always 0, so the padding is the constant (k - 1) * dilation,
    and across calls it is the previous call's last (k - 1) * dilation inputs (zeros when fresh).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.left_pad = (kernel_size - 1) * dilation

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"tail": (self.conv.in_channels, self.left_pad)} if self.left_pad else {}

    def forward(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T]
        if self.left_pad:
            x = carry.extend(self, "tail", x)  # [B, C_in, left_pad + T]
        return self.conv(x)


class CausalConvTranspose1d(Stateful):
    """Transposed conv upsampling T -> T * stride; the kernel's overhang is cut on the right only.

    Output sample p sums inputs p // stride - j for j < ceil(kernel / stride), so each call needs
    the previous call's last `overlap` inputs (1 for the decoder's kernel = 2 * stride, none for the
    upsampler's kernel = stride).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = -(-kernel_size // stride) - 1

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"tail": (self.conv.in_channels, self.overlap)} if self.overlap else {}

    def forward(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T * stride]
        frames = x.shape[-1]
        if self.overlap:
            x = carry.extend(self, "tail", x)  # [B, C_in, overlap + T]
        # conv gives (overlap + T - 1) * stride + kernel_size samples; the first overlap * stride
        # belong to the previous call, the ones after T new inputs' worth to the next.
        first = self.overlap * self.stride
        return self.conv(x)[..., first : first + frames * self.stride]


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

    def forward(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:  # [B, C, T]
        return x + self.conv2(self.act2(self.conv1(self.act1(x), carry)), carry)


class DecoderBlock(nn.Module):
    """SnakeBeta, upsample by `rate` while halving channels, then three dilated residual units."""

    def __init__(self, in_channels: int, out_channels: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [
                SnakeBeta(in_channels),
                CausalConvTranspose1d(in_channels, out_channels, kernel_size=2 * rate, stride=rate),
                *(ResidualUnit(out_channels, dilation) for dilation in (1, 3, 9)),
            ]
        )

    def forward(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:  # [B, C_in, T] -> [B, C_out, T * rate]
        snake, upsample, *units = self.block
        x = upsample(snake(x), carry)
        for unit in units:
            x = unit(x, carry)
        return x


class ConvNeXtBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.dwconv = CausalConv1d(channels, channels, kernel_size=7, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.pwconv1 = nn.Linear(channels, 4 * channels)
        self.pwconv2 = nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor, carry: Carry) -> torch.Tensor:  # [B, C, T]
        h = self.dwconv(x, carry).transpose(1, 2)  # [B, T, C]
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


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, F, head_dim] for integer positions [B, F] (HF default RoPE, halves duplicated)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / theta**exponents  # [D/2]
    freqs = positions.float()[..., None] * inv_freq  # [B, F, D/2]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, F, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [B, H, F, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def sliding_window_mask(start: torch.Tensor, num_frames: int, window: int) -> torch.Tensor:
    """[B, 1, F, window - 1 + F] bool: may new frame i attend key j of (kept history, new frames)?

    Key j is at position start + j - (window - 1) and new frame i at start + i. transformers 4.57.3
    allows kv_idx > q_idx - window, so a frame sees itself and the window - 1 frames before it
    (72 keys, 71 of them earlier, for the released config). History rows at negative positions are
    the zeros of a fresh stream (start < window - 1) and are masked out.
    """
    history = window - 1
    query = torch.arange(num_frames, device=start.device)[:, None]  # [F, 1], relative to start
    key = torch.arange(history + num_frames, device=start.device)[None, :] - history  # [1, K], relative to start
    distance = query - key  # [F, K]
    in_window = (distance >= 0) & (distance < window)
    real = key >= -start[:, None]  # [B, K]
    return (in_window[None] & real[:, None, :])[:, None]  # [B, 1, F, K]


class Attention(Stateful):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.history = config.sliding_window - 1
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The last window - 1 keys (after RoPE) and values."""
        shape = (self.kv_heads, self.history, self.head_dim)
        return {"keys": shape, "values": shape}

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, carry: Carry
    ) -> torch.Tensor:
        batch, frames, _ = x.shape  # [B, F, hidden]
        q = self.q_proj(x).view(batch, frames, self.heads, self.head_dim).transpose(1, 2)  # [B, H, F, D]
        k = self.k_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, F, D]
        v = self.v_proj(x).view(batch, frames, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = carry.extend(self, "keys", k, dim=2)  # [B, Hkv, K, D], K = window - 1 + F
        v = carry.extend(self, "values", v, dim=2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)  # [B, H, K, D]
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.head_dim**-0.5  # [B, H, F, K]
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

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, carry: Carry
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, carry))
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

    def forward(self, x: torch.Tensor, start: torch.Tensor, carry: Carry) -> torch.Tensor:
        """[B, F, latent] -> [B, F, latent]; row b's first frame is at position start[b]."""
        frames = x.shape[1]
        positions = start[:, None] + torch.arange(frames, device=start.device)  # [B, F]
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)  # [B, 1, F, D]
        mask = sliding_window_mask(start, frames, self.config.sliding_window)  # [B, 1, F, K]
        x = self.input_proj(x)  # [B, F, hidden]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, carry)
        return self.output_proj(self.norm(x))


# ------------------------------------------------------------------------------------------ model


class Codec(nn.Module):
    """codes [B, G, F] int64 -> pcm [B, F * samples_per_frame] float32 in [-1, 1].

    `forward` decodes whole utterances; `decode` continues streams from their carried state.
    Submodule names follow the checkpoint's `decoder.*` keys, except the quantizer (see
    `load_codec`).
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.quantizer = QuantizerDecoder(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = Transformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    CausalConvTranspose1d(config.latent_dim, config.latent_dim, kernel_size=ratio, stride=ratio),
                    ConvNeXtBlock(config.latent_dim),
                ]
            )
            for ratio in config.upsampling_ratios
        )
        channels = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv1d(config.latent_dim, channels[0], kernel_size=7),
                *(DecoderBlock(channels[i], channels[i + 1], rate) for i, rate in enumerate(config.upsample_rates)),
                SnakeBeta(channels[-1]),
                CausalConv1d(channels[-1], 1, kernel_size=7),
            ]
        )
        # (qualified name, owner, kind, shape without batch) for every state tensor, in module order.
        self.state_slots = tuple(
            (f"{path}.{kind}", module, kind, shape)
            for path, module in self.named_modules()
            if isinstance(module, Stateful)
            for kind, shape in module.state_shapes().items()
        )

    def state_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape without batch) of every state tensor, in the order `decode` takes them."""
        return [(name, shape) for name, _, _, shape in self.state_slots]

    def fresh_state(self, batch: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
        """The state of `batch` streams that have decoded nothing yet: all zeros."""
        return [torch.zeros(batch, *shape, device=device) for _, _, _, shape in self.state_slots]

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, G, F] -> [B, F * samples_per_frame]
        """A whole utterance: one call of a fresh stream."""
        start = torch.zeros(codes.shape[0], dtype=torch.int64, device=codes.device)
        pcm, _ = self.decode(codes, start, self.fresh_state(codes.shape[0], codes.device))
        return pcm

    def decode(
        self, codes: torch.Tensor, start: torch.Tensor, state: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The next F frames of B streams: codes [B, G, F] int64, start [B] int64 (frames each
        stream has decoded so far), state as `state_specs` with batch first.
        Returns pcm [B, F * samples_per_frame] and the state after these frames, shaped as `state`.
        """
        if len(state) != len(self.state_slots):
            raise ValueError(f"expected {len(self.state_slots)} state tensors, got {len(state)}")
        carry = Carry({(module, kind): s for (_, module, kind, _), s in zip(self.state_slots, state)})
        x = self.quantizer(codes)  # [B, codebook_dim, F]
        x = self.pre_conv(x, carry).transpose(1, 2)  # [B, F, latent]
        x = self.pre_transformer(x, start, carry).transpose(1, 2)  # [B, latent, F]
        for upsample, convnext in self.upsample:
            x = convnext(upsample(x, carry), carry)  # [B, latent, F * the ratios so far]
        first, *blocks, snake, last = self.decoder
        x = first(x, carry)
        for block in blocks:
            x = block(x, carry)
        pcm = last(snake(x), carry)  # [B, 1, F * samples_per_frame]
        return pcm.squeeze(1).clamp(-1.0, 1.0), [carry.kept[(module, kind)] for _, module, kind, _ in self.state_slots]


class StreamingCodec(nn.Module):
    """The exported vocoder graph: `Codec.decode` with flat inputs and outputs,
    (codes, start, *state) -> (pcm, *new_state). Shares the codec's weights."""

    def __init__(self, codec: Codec):
        super().__init__()
        self.codec = codec

    def forward(self, codes: torch.Tensor, start: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pcm, new_state = self.codec.decode(codes, start, state)
        return (pcm, *new_state)


def state_specs(config: CodecConfig) -> list[tuple[str, tuple[int, ...]]]:
    """`Codec.state_specs` for a config, without allocating weights."""
    with torch.device("meta"):
        return Codec(config).state_specs()


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

CODES, START, PCM = "codes", "start", "pcm"  # [B, G, F] int64, [B] int64, [B, F * samples_per_frame] float32
EXPORT_CHECK_TOLERANCE = 1e-3  # ORT vs torch on the exported weights; measured errors are ~1e-7
CHECK_WINDOWS = (3, 1, 4)  # frames per call of the post-export check, the first call from fresh state


def state_names(count: int) -> tuple[list[str], list[str]]:
    """Graph names of the state inputs and outputs: state_in_i / state_out_i."""
    return [f"state_in_{i}" for i in range(count)], [f"state_out_{i}" for i in range(count)]


def export_vocoder(checkpoint_dir: str | Path, out_path: str | Path, opset: int = 18) -> dict:
    """Writes the streaming `vocoder` graph of docs/artifact.md for a checkpoint and returns its
    manifest entry (see `export_codec`)."""
    _, codec = load_codec(checkpoint_dir)
    return export_codec(codec, out_path, opset)


def export_codec(codec: Codec, out_path: str | Path, opset: int = 18) -> dict:
    """Exports `StreamingCodec(codec)` as one self-contained ONNX file, checks its dims (B and F
    dynamic, state dims static) and runs it on ONNX Runtime, streaming two random utterances in
    windows of CHECK_WINDOWS frames, against the torch whole decode. Raises if they differ by more
    than EXPORT_CHECK_TOLERANCE. Returns the manifest entry:

      {"inputs": ["codes", "start", "state_in_0", ...], "outputs": ["pcm", "state_out_0", ...],
       "state": [{"input": "state_in_0", "output": "state_out_0", "shape": [...]}, ...]}

    with each state shape given without its leading batch axis.
    """
    config = codec.config
    specs = codec.state_specs()
    state_in, state_out = state_names(len(specs))
    manifest = {
        "inputs": [CODES, START, *state_in],
        "outputs": [PCM, *state_out],
        "state": [
            {"input": i, "output": o, "shape": list(shape)} for i, o, (_, shape) in zip(state_in, state_out, specs)
        ],
    }
    # torch.export specialises a dim whose example size is 1, and an example size equal to a static
    # dim can be unified with it, so B and F get example sizes >= 2 that no other dim has.
    batch, frames = _example_sizes({config.num_quantizers, *(d for _, shape in specs for d in shape)})
    example = (
        torch.zeros(batch, config.num_quantizers, frames, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        *codec.fresh_state(batch),
    )
    batch_dim, frames_dim = torch.export.Dim("batch"), torch.export.Dim("frames")
    # The varargs `*state` of StreamingCodec.forward take their dims as one nested tuple.
    dynamic = ({0: batch_dim, 2: frames_dim}, {0: batch_dim}, tuple({0: batch_dim} for _ in specs))
    with torch.no_grad():
        torch.onnx.export(
            StreamingCodec(codec).eval(),
            example,
            str(out_path),
            dynamo=True,
            opset_version=opset,
            input_names=manifest["inputs"],
            output_names=manifest["outputs"],
            dynamic_shapes=dynamic,
            external_data=False,
        )
    _check_dims(onnx.load(str(out_path), load_external_data=False), config, specs)
    error = verify_onnx(codec, out_path, batch=2, windows=CHECK_WINDOWS)
    if error > EXPORT_CHECK_TOLERANCE:
        raise RuntimeError(f"{out_path}: ONNX Runtime differs from torch by {error:.3g}")
    return manifest


def _example_sizes(taken: set[int]) -> tuple[int, int]:
    """(batch, frames) example sizes: distinct, >= 2, and not in `taken`."""
    free = (n for n in range(2, 2 + len(taken) + 2) if n not in taken)
    return next(free), next(free)


def _check_dims(model: onnx.ModelProto, config: CodecConfig, specs: Sequence[tuple[str, tuple[int, ...]]]) -> None:
    """codes [B, G, F], start [B], pcm [B, P], every state [B, *static shape], with B, F (and P)
    dynamic, B one symbol throughout and F another."""

    def dims(value: onnx.ValueInfoProto) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    shapes = {v.name: dims(v) for v in (*model.graph.input, *model.graph.output)}
    state_in, state_out = state_names(len(specs))
    codes = shapes[CODES]
    batch, frames = (codes[0], codes[2]) if len(codes) == 3 else (None, None)
    expected = {CODES: [batch, config.num_quantizers, frames], START: [batch]}
    for i, o, (_, shape) in zip(state_in, state_out, specs):
        expected[i] = expected[o] = [batch, *shape]
    pcm = shapes[PCM]
    problems = [f"{name} is {shapes.get(name)}, expected {want}" for name, want in expected.items()
                if shapes.get(name) != want]
    if not (isinstance(batch, str) and isinstance(frames, str) and batch != frames):
        problems.append(f"codes is {codes}: B and F must be distinct dynamic dims")
    if len(pcm) != 2 or pcm[0] != batch or not isinstance(pcm[1], str):
        problems.append(f"pcm is {pcm}, expected [{batch}, dynamic]")
    if problems:
        raise RuntimeError("exported vocoder shapes: " + "; ".join(problems))


def verify_onnx(codec: Codec, onnx_path: str | Path, batch: int, windows: Sequence[int], seed: int = 0) -> float:
    """Max |ORT - torch| between streaming random codes [batch, G, sum(windows)] through the graph
    (window by window from fresh state, state_out fed back as state_in) and the torch whole decode."""
    config = codec.config
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, config.codebook_size, (batch, config.num_quantizers, sum(windows)), generator=generator)
    with torch.no_grad():
        expected = codec(codes).numpy()  # [B, P]
    state_in, state_out = state_names(len(codec.state_slots))
    state = [s.numpy() for s in codec.fresh_state(batch)]
    start, chunks = 0, []
    for frames in windows:
        feeds = {CODES: codes[..., start : start + frames].numpy(), START: np.full(batch, start, dtype=np.int64)}
        pcm, *state = session.run([PCM, *state_out], {**feeds, **dict(zip(state_in, state))})
        if pcm.shape != (batch, frames * config.samples_per_frame):
            raise RuntimeError(f"ONNX pcm {pcm.shape} for codes {feeds[CODES].shape}")
        chunks.append(pcm)
        start += frames
    return float(np.abs(np.concatenate(chunks, axis=1) - expected).max())
