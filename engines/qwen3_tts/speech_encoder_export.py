"""The 12 Hz speech tokenizer's encoder (Mimi + split RVQ) as one ONNX graph: 24 kHz PCM in, codes out.

Voice cloning turns reference audio into codes with qwen-tts's `speech_tokenizer.encode(wav, sr=24000)`.
For 24 kHz mono float32 audio that wrapper does nothing to the samples: the Encodec feature extractor
(no chunk_length) neither pads nor normalizes one sequence, and its padding mask is all ones. The model
then runs the Mimi encoder (causal SEANet convs, a causal transformer, a stride-2 downsampling conv) and
the split RVQ, keeps the first `encoder_valid_num_quantizers` groups and trims to ceil(N / 1920) frames,
which is exactly how many the conv stack makes. So the graph takes the raw samples, no caller padding:

    pcm   float32 [1, N]      N >= 1 samples, 24 kHz mono (resample and downmix before, as the wrapper does)
    codes int64   [1, T, G]   T = ceil(N / 1920), G = encoder_valid_num_quantizers

`SpeechEncoderGraph` computes what the library computes, rewritten so one trace serves every N:

- Each causal conv pads `kernel - stride` on the left (zeros, or copies of the first frame for the
  replicate-padded downsampler) like the library, and `stride - 1` on the right where the library pads
  `(-L) mod stride`: the conv drops the incomplete last window, so both give ceil(L / stride) outputs
  that read the same samples, without a pad amount computed from the length.
- Attention is plain causal. transformers 4.57's Mimi builds its mask with `create_causal_mask`, which
  ignores `config.sliding_window`, so the library attends to every earlier frame; so does the graph.
- Nearest codebook entry: the distances are torch.cdist's matmul form, sqrt(max(|x|^2 - 2 x.e + |e|^2, 0)),
  built from the same augmented matrices, then the first argmin, so the sqrt/clamp ties fall the same way.

Exported with the TorchScript exporter (dynamo=False) at opset 17: MatMul, Conv, LayerNormalization,
Erf, Sqrt, ArgMin, Gather, Slice, Concat, Range; no Loop/If, no complex numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

PCM, CODES = "pcm", "codes"
OPSET = 17
EXPORT_CHECK_SECONDS = (1.0, 2.7)  # post-export check lengths; the second is not a whole number of frames
EXPORT_CHECK_MAX_MISMATCH = 0.02  # fraction of frames allowed to differ in that check (fp32 near-ties)


def export_speech_encoder(speech_tokenizer: Any, out: Path) -> None:
    """Write the encoder graph of `speech_tokenizer` (qwen-tts's `Qwen3TTSTokenizer` wrapper or the
    `Qwen3TTSTokenizerV2Model` itself) to `out` as one self-contained ONNX file.

    Afterwards checks the graph's dims and runs it on ONNX Runtime for EXPORT_CHECK_SECONDS of a test
    signal against the library's own `encode`; raises if the frame count differs or more than
    EXPORT_CHECK_MAX_MISMATCH of the frames carry different codes.
    """
    model = _tokenizer_model(speech_tokenizer)
    graph = SpeechEncoderGraph(model).eval()
    example = torch.from_numpy(probe_signal(int(1.3 * graph.sample_rate)))[None]  # [1, N], N not a frame multiple
    with torch.no_grad():
        torch.onnx.export(
            graph, (example,), str(out), dynamo=False, opset_version=OPSET,
            input_names=[PCM], output_names=[CODES],
            dynamic_axes={PCM: {1: "samples"}, CODES: {1: "frames"}},
        )
    _check_dims(onnx.load(str(out)), graph.num_groups)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for seconds in EXPORT_CHECK_SECONDS:
        pcm = probe_signal(int(seconds * graph.sample_rate))
        (got,) = session.run([CODES], {PCM: pcm[None]})
        want = library_codes(model, pcm)
        if got.shape != (1, *want.shape):
            raise RuntimeError(f"{out}: ONNX codes {got.shape} for {pcm.size} samples, library {want.shape}")
        mismatch = float(np.mean(np.any(got[0] != want, axis=-1)))
        if mismatch > EXPORT_CHECK_MAX_MISMATCH:
            raise RuntimeError(f"{out}: ONNX codes differ from the library's in {mismatch:.1%} of the frames")


def num_frames(num_samples: int, samples_per_frame: int = 1920) -> int:
    """Frames the encoder makes for `num_samples` samples: ceil(N / samples_per_frame)."""
    return -(-num_samples // samples_per_frame)


def probe_signal(num_samples: int, seed: int = 0, sample_rate: int = 24000) -> np.ndarray:
    """A deterministic probe input, float32 [num_samples]: two sines and seeded noise, ~0.3 peak."""
    t = np.arange(num_samples, dtype=np.float64) / sample_rate
    noise = np.random.default_rng(seed).standard_normal(num_samples)
    pcm = 0.15 * np.sin(2 * np.pi * 220 * t) + 0.08 * np.sin(2 * np.pi * 1375 * t + 0.5) + 0.05 * noise
    return pcm.astype(np.float32)


def library_codes(model: Any, pcm: np.ndarray) -> np.ndarray:
    """`Qwen3TTSTokenizerV2Model.encode` on one 24 kHz mono float32 waveform the way the qwen-tts wrapper
    calls it (all-ones padding mask): codes int64 [T, G]."""
    wav = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32))[None]  # [1, N]
    with torch.inference_mode():
        (codes,) = model.encode(wav, torch.ones_like(wav, dtype=torch.int64), return_dict=False)
    return codes[0].numpy()


def _tokenizer_model(speech_tokenizer: Any) -> Any:
    """The `Qwen3TTSTokenizerV2Model` inside qwen-tts's wrapper, or the model itself."""
    model = getattr(speech_tokenizer, "model", speech_tokenizer)
    if not hasattr(model, "encoder_valid_num_quantizers"):
        raise TypeError(f"{type(speech_tokenizer).__name__} is not a 12 Hz speech tokenizer (Qwen3TTSTokenizerV2Model)")
    return model


def _check_dims(model: onnx.ModelProto, num_groups: int) -> None:
    """pcm [1, samples] and codes [1, frames, G], with samples and frames dynamic."""

    def dims(value: onnx.ValueInfoProto) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    shapes = {v.name: dims(v) for v in (*model.graph.input, *model.graph.output)}
    expected = {PCM: [1, "samples"], CODES: [1, "frames", num_groups]}
    problems = [f"{name} is {shapes.get(name)}, expected {want}" for name, want in expected.items()
                if shapes.get(name) != want]
    if problems:
        raise RuntimeError("exported speech encoder shapes: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ graph


class SpeechEncoderGraph(nn.Module):
    """pcm [1, N] -> codes [1, ceil(N / 1920), G]: the library's Mimi encode, traceable for any N.

    Holds the library's own submodules (convs, transformer layers, quantizer codebooks); only the
    padding, the attention mask and the nearest-entry search are written out here.
    """

    inv_freq: torch.Tensor  # [head_dim / 2], the rotary frequencies

    def __init__(self, model: Any):
        super().__init__()
        mimi = model.encoder
        config = mimi.config
        self.sample_rate = int(model.input_sample_rate)
        self.num_groups = int(model.encoder_valid_num_quantizers)
        if config.audio_channels != 1 or not config.use_causal_conv or config.pad_mode != "constant":
            raise ValueError("only the mono, causal, zero-padded Mimi encoder is supported")
        if mimi.downsample is None:
            raise ValueError("a Mimi encoder without its downsampling conv is not supported")
        # frames come from the conv strides, the library's trim from encode_downsample_rate: they must agree
        strides = math.prod(config.upsampling_ratios) * mimi.downsample.conv.stride[0]
        if strides != model.encode_downsample_rate:
            raise ValueError(f"conv strides give {strides} samples per frame, encode_downsample_rate is "
                             f"{model.encode_downsample_rate}")
        self.encoder = mimi.encoder
        self.layers = mimi.encoder_transformer.layers
        self.downsample = mimi.downsample
        quantizer = mimi.quantizer
        semantic, acoustic = quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer
        num_semantic = min(quantizer.num_semantic_quantizers, self.num_groups)
        self.semantic = _ResidualQuantizer(semantic, num_semantic)
        self.acoustic = _ResidualQuantizer(acoustic, self.num_groups - num_semantic) if self.num_groups > num_semantic else None
        attention = self.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = attention.num_heads, attention.num_key_value_heads, attention.head_dim
        self.register_buffer("inv_freq", attention.rotary_emb.inv_freq.float().clone(), persistent=False)
        self.rope_scaling = float(attention.rotary_emb.attention_scaling)

    def forward(self, pcm: torch.Tensor) -> torch.Tensor:
        x = pcm[:, None, :]  # [1, 1, N]
        for layer in self.encoder.layers:
            x = self._seanet_layer(layer, x)  # -> [1, hidden, ceil(N / 960)]
        h = x.transpose(1, 2)  # [1, F, hidden]
        cos, sin = self._rotary(h)
        mask = _causal_mask(h)
        for layer in self.layers:
            h = self._transformer_layer(layer, h, cos, sin, mask)
        x = _causal_conv(self.downsample, h.transpose(1, 2), replicate=True)  # [1, hidden, T]
        groups = self.semantic(x)
        if self.acoustic is not None:
            groups += self.acoustic(x)
        return torch.stack(groups, dim=-1)  # [1, T, G]

    def _seanet_layer(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """One entry of MimiEncoder.layers: a conv, an ELU, or a residual block (ELU, conv, ELU, conv)."""
        if hasattr(layer, "block"):
            if not isinstance(layer.shortcut, nn.Identity):
                raise ValueError("Mimi conv shortcuts (use_conv_shortcut) are not supported")
            y = x
            for sub in layer.block:
                y = self._seanet_layer(sub, y)
            return x + y
        if hasattr(layer, "conv"):
            return _causal_conv(layer, x, replicate=False)
        return layer(x)

    def _rotary(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MimiRotaryEmbedding for positions 0..F-1: cos, sin [1, 1, F, head_dim]."""
        positions = torch.arange(h.shape[1], device=h.device).float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # the library's k=1 matmul: one product per entry
        emb = torch.cat((freqs, freqs), dim=-1)[None, None]
        return emb.cos() * self.rope_scaling, emb.sin() * self.rope_scaling

    def _transformer_layer(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
        """MimiTransformerLayer: pre-norm attention and MLP, each scaled by its LayerScale."""
        h = h + layer.self_attn_layer_scale(self._attention(layer.self_attn, layer.input_layernorm(h), cos, sin, mask))
        return h + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))

    def _attention(self, attn: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
        """Causal self-attention with rotary q/k; softmax in fp32 as the library."""
        q = attn.q_proj(h).view(1, -1, self.num_heads, self.head_dim).transpose(1, 2)  # [1, H, F, D]
        k = attn.k_proj(h).view(1, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [1, Hkv, F, D]
        v = attn.v_proj(h).view(1, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.num_heads != self.num_kv_heads:  # repeat_kv: each kv head serves n consecutive heads
            n = self.num_heads // self.num_kv_heads
            k = k[:, :, None].expand(-1, -1, n, -1, -1).reshape(1, self.num_heads, -1, self.head_dim)
            v = v[:, :, None].expand(-1, -1, n, -1, -1).reshape(1, self.num_heads, -1, self.head_dim)
        scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.head_dim)) + mask  # [1, H, F, F]
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)  # [1, F, H, D]
        return attn.o_proj(out.reshape(1, -1, self.num_heads * self.head_dim))


class _ResidualQuantizer(nn.Module):
    """The first `count` layers of a MimiResidualVectorQuantizer's encode: project, then per layer take
    the nearest codebook entry of the residual and subtract it."""

    def __init__(self, rvq: Any, count: int):
        super().__init__()
        self.input_proj = rvq.input_proj
        embeds = [layer.codebook.embed.detach().float() for layer in rvq.layers[:count]]  # [K, D] each
        # torch.cdist's p=2 matmul path pairs x_ = [-2x, |x|^2, 1] with e_ = [e, 1, |e|^2]
        for i, embed in enumerate(embeds):
            ones = torch.ones_like(embed[:, :1])
            self.register_buffer(f"embed_{i}", embed.clone(), persistent=False)
            self.register_buffer(f"embed_aug_{i}", torch.cat([embed, ones, embed.pow(2).sum(-1, keepdim=True)], -1),
                                 persistent=False)
        self.count = count

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual = x.transpose(1, 2)[0]  # [T, D]
        codes = []
        for i in range(self.count):
            embed, embed_aug = getattr(self, f"embed_{i}"), getattr(self, f"embed_aug_{i}")
            aug = torch.cat([residual * -2.0, residual.pow(2).sum(-1, keepdim=True), torch.ones_like(residual[:, :1])], -1)
            dists = torch.matmul(aug, embed_aug.t()).clamp_min(0).sqrt()  # [T, K]
            index = dists.argmin(dim=-1)  # [T], the first of equal minima
            residual = residual - embed[index]
            codes.append(index[None])  # [1, T]
        return codes


def _causal_conv(layer: Any, x: torch.Tensor, replicate: bool) -> torch.Tensor:
    """MimiConv1d without a length-dependent pad: `kernel - stride` on the left as the library, then
    `stride - 1` on the right; the conv drops the incomplete window, leaving ceil(L / stride) outputs
    over the same samples the library's `(-L) mod stride` right pad gives."""
    conv = layer.conv
    left = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1 - conv.stride[0]
    right = conv.stride[0] - 1
    if replicate:  # copies of the edge frames, written as Slice + Concat
        first, last = x[..., :1], x[..., -1:]
        x = torch.cat([first] * left + [x] + [last] * right, dim=-1)
    elif left or right:
        x = nn.functional.pad(x, (left, right))
    return conv(x)


def _causal_mask(h: torch.Tensor) -> torch.Tensor:
    """Additive causal mask [F, F]: 0 where key <= query, the fp32 minimum elsewhere (as the eager path)."""
    positions = torch.arange(h.shape[1], device=h.device)
    allowed = positions[None, :] <= positions[:, None]
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min).to(h.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
