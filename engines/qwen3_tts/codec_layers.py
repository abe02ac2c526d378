"""The blocks of the Qwen3-TTS 12 Hz speech-tokenizer decoder, each carrying its stream state.

`Stateful` modules declare what a streamed decode must carry from one call to the next (a causal
conv's input tail, a transposed conv's overlap, an attention layer's last keys and values);
`Carry` holds it during one call. Ported from qwen-tts 0.1.1
`qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`; the model is `codec.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as nnf

from engines.layers import MLP, RMSNorm

if TYPE_CHECKING:
    from engines.qwen3_tts.codec import CodecConfig

NUM_SEMANTIC_QUANTIZERS = 1  # the reference hard-codes one semantic codebook (group 0)
SNAKE_EPS = 1e-9  # SnakeBeta's guard against dividing by exp(beta) = 0


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
    """SnakeBeta, upsample by `rate` while halving channels, then three dilated residual units.

    `lead` > 0 (Qwen3-Omni's code2wav): the reference cuts its transposed conv's overhang on the
    left too, so its stream starts `lead` samples (at this block's rate, this block's own cut plus
    the earlier blocks' upsampled) after ours, with zeros before that start. Zeroing the samples of a
    stream's global index < lead after the upsample and after every residual unit reproduces it
    exactly; only a stream's first frame is touched, and the stream's first `lead` samples at the
    output are the host's to drop (`CodecConfig.lead_samples`)."""

    def __init__(self, in_channels: int, out_channels: int, rate: int, lead: int = 0, samples_per_frame: int = 0):
        super().__init__()
        self.lead, self.samples_per_frame = lead, samples_per_frame
        self.block = nn.ModuleList(
            [
                SnakeBeta(in_channels),
                CausalConvTranspose1d(in_channels, out_channels, kernel_size=2 * rate, stride=rate),
                *(ResidualUnit(out_channels, dilation) for dilation in (1, 3, 9)),
            ]
        )

    def forward(self, x: torch.Tensor, carry: Carry, start: torch.Tensor) -> torch.Tensor:
        """[B, C_in, T] -> [B, C_out, T * rate]; `start` [B]: frames each stream decoded before."""
        snake, upsample, *units = self.block
        x = upsample(snake(x), carry)
        keep = None
        if self.lead:
            index = start[:, None] * self.samples_per_frame + torch.arange(x.shape[-1], device=x.device)  # [B, T']
            keep = (index >= self.lead).to(x.dtype).unsqueeze(1)  # [B, 1, T']
            x = x * keep
        for unit in units:
            x = unit(x, carry)
            if keep is not None:
                x = x * keep
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


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, carry: Carry
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, carry))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """latent_dim -> hidden_size, causal sliding-window layers, final norm, back to latent_dim (the
    projections only where the widths differ: Qwen3-TTS)."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        project = config.front_end == "rvq"  # Qwen3-Omni's transformer is as wide as its conv path
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size) if project else nn.Identity()
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim) if project else nn.Identity()

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
