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

This file: config, model, loading. The blocks are `codec_layers.py`; the ONNX export and its
check, `codec_export.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engines.config import Section, head_dim, read_rope
from engines.qwen3_tts.codec_layers import (
    NUM_SEMANTIC_QUANTIZERS,
    Carry,
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    DecoderBlock,
    QuantizerDecoder,
    SnakeBeta,
    Stateful,
    Transformer,
)
from engines.weights import Checkpoint

CODEBOOK_EPS = 1e-5  # EuclideanCodebook clamps cluster_usage to this before dividing


# ----------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class CodecConfig:
    """The codec's config: Qwen3-TTS's `speech_tokenizer/config.json` (`decoder_config` and the output
    rates) or Qwen3-Omni's `code2wav_config`, read by `read_codec`: every value from the checkpoint."""

    codebook_dim: int
    """Width of the summed codebook vectors; each codebook stores codebook_dim // 2 wide entries."""
    codebook_size: int
    """Entries per codebook (codes are 0..codebook_size-1)."""
    latent_dim: int
    """Channels of the conv path around the transformer."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    sliding_window: int
    """Keys per query, the query's own frame included (HF: kv_idx > q_idx - sliding_window)."""
    rope_theta: float
    """Default RoPE, computed for any position as in the reference (max_position_embeddings is no limit)."""
    rms_norm_eps: float
    layer_scale_initial_scale: float
    num_quantizers: int
    """Code groups G per frame: 1 semantic + G-1 acoustic."""
    upsample_rates: tuple[int, ...]
    """Strides of the SnakeBeta decoder blocks."""
    upsampling_ratios: tuple[int, ...]
    """Strides of the ConvNeXt upsampler that follows the transformer."""
    decoder_dim: int
    """Channels entering the first decoder block; each block halves them."""
    output_sample_rate: int
    """Hz."""
    decode_upsample_rate: int
    """Output samples per code frame, as the checkpoint declares it."""
    front_end: str
    """"rvq": Qwen3-TTS's codebooks, projections and pre_conv; "embedding": Qwen3-Omni's code2wav,
    one code_embedding table averaged over the groups, straight into the transformer (latent_dim =
    hidden_size), and decoder blocks whose transposed convs are cut on the left too."""

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
        if self.front_end not in ("rvq", "embedding"):
            raise ValueError(f"front_end={self.front_end!r} is not rvq or embedding")
        if self.front_end == "embedding" and self.latent_dim != self.hidden_size:
            raise ValueError("an embedding front end feeds the transformer directly: latent_dim must be hidden_size")

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    def block_leads(self) -> list[int]:
        """Per decoder block, the samples (at its output rate) by which the reference's stream
        starts later than ours: 0 for Qwen3-TTS; for Qwen3-Omni each block cuts `rate` on the left
        after upsampling the earlier blocks' cut (8, 45, 184, 555 for rates 8, 5, 4, 3)."""
        leads, lead = [], 0
        for rate in self.upsample_rates:
            lead = (lead * rate + rate) if self.front_end == "embedding" else 0
            leads.append(lead)
        return leads

    @property
    def lead_samples(self) -> int:
        """Samples at the start of every stream that the reference does not return (the host drops
        them): the last block's lead."""
        return self.block_leads()[-1]

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> CodecConfig:
        """Qwen3-TTS's decoder: `<checkpoint_dir>/speech_tokenizer/config.json`."""
        top = Section.read(Path(checkpoint_dir) / "speech_tokenizer" / "config.json")
        dec = top.section("decoder_config")
        return read_codec(dec, front_end="rvq", codebook_dim=dec.need("codebook_dim"),
                          latent_dim=dec.need("latent_dim"), output_sample_rate=top.need("output_sample_rate"),
                          decode_upsample_rate=top.need("decode_upsample_rate"))


def read_codec(s: Section, **given) -> CodecConfig:
    """The decoder transformer and conv stack of a codec config section (either transformers layout),
    plus the values the family reads elsewhere (`given`). Settings this port does not implement fail
    here rather than decode wrongly."""
    for key, supported in (("attention_bias", False), ("hidden_act", "silu")):
        s.expect(key, supported)
    values = {k: s.need(k) for k in ("codebook_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "intermediate_size", "sliding_window", "num_quantizers",
                                     "decoder_dim")}
    values.update({k: s.need(k, float) for k in ("rms_norm_eps", "layer_scale_initial_scale")})
    values.update({k: tuple(s.need(k, list)) for k in ("upsample_rates", "upsampling_ratios")})
    dim = head_dim(s)
    return CodecConfig(**values, head_dim=dim, rope_theta=read_rope(s, dim, multimodal=False).theta, **given)


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
        if config.front_end == "rvq":
            self.quantizer = QuantizerDecoder(config)
            self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        else:
            self.code_embedding = nn.Embedding(config.num_quantizers * config.codebook_size, config.hidden_size)
            self.register_buffer("code_offset", torch.arange(config.num_quantizers)[None, :, None] * config.codebook_size,
                                 persistent=False)
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
        per_frame = [math.prod(config.upsampling_ratios) * math.prod(config.upsample_rates[: i + 1])
                     for i in range(len(config.upsample_rates))]  # samples per frame after each block
        self.decoder = nn.ModuleList(
            [
                CausalConv1d(config.latent_dim, channels[0], kernel_size=7),
                *(DecoderBlock(channels[i], channels[i + 1], rate, lead, spf) for i, (rate, lead, spf)
                  in enumerate(zip(config.upsample_rates, config.block_leads(), per_frame))),
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
        if self.config.front_end == "rvq":
            x = self.pre_conv(self.quantizer(codes), carry).transpose(1, 2)  # [B, F, latent]
        else:  # the mean of the groups' embeddings
            x = self.code_embedding(codes.clamp(0, self.config.codebook_size - 1) + self.code_offset).mean(1)
        x = self.pre_transformer(x, start, carry).transpose(1, 2)  # [B, latent, F]
        for upsample, convnext in self.upsample:
            x = convnext(upsample(x, carry), carry)  # [B, latent, F * the ratios so far]
        first, *blocks, snake, last = self.decoder
        x = first(x, carry)
        for block in blocks:
            x = block(x, carry, start)
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
    """Builds the decoder from `<checkpoint_dir>/speech_tokenizer/` (config.json, and the weights in
    one file or shards), reading only the decoder's tensors, one at a time.

    Strict both ways: every tensor the decoder needs must be present with the expected shape, and
    every `decoder.*` tensor must be used (other than the quantizer's encode-only input_proj); the
    errors name the checkpoint keys. The Mimi encoder's tensors are ignored. Weights load as float32.
    """
    config = CodecConfig.from_checkpoint(checkpoint_dir)
    store = Checkpoint(Path(checkpoint_dir) / "speech_tokenizer")
    codec = Codec(config)
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in store:
            raise ValueError(f"{store.directory}: missing tensor {key!r} needed by the vocoder")
        used.add(key)
        return store.read(key)

    for name, target in codec.state_dict().items():  # each copied into place as it is read
        key, tensor = _checkpoint_tensor(name, take, config)
        if tensor.shape != target.shape:
            raise ValueError(f"{store.where(key)} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)
    unused = sorted(k for k in set(store.files) - used - _ENCODE_ONLY if k.startswith("decoder."))
    if unused:
        raise ValueError(f"{store.directory}: decoder tensors this port does not use: {', '.join(unused)}")
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
