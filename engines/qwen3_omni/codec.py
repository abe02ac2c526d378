"""Qwen3-Omni's code2wav as the shared streaming codec (`engines.qwen3_tts.codec.Codec` with the
`embedding` front end): config from the checkpoint's `code2wav_config`, weights from `code2wav.*`.

The library's `Qwen3OmniMoeCode2Wav.forward` returns 1920 x F - lead samples for F frames; the
streaming graph returns 1920 x F per call and the host drops each stream's first `lead_samples`
(555 at the released rates), so a stream decoded in windows equals the library's whole decode.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from engines.qwen3_tts.codec import Codec, CodecConfig

KEYS = ("codebook_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "sliding_window", "rope_theta", "rms_norm_eps", "layer_scale_initial_scale",
        "num_quantizers", "upsample_rates", "upsampling_ratios", "decoder_dim", "max_position_embeddings")


def codec_config(checkpoint: Path) -> CodecConfig:
    """The codec config of a Qwen3-Omni checkpoint's `code2wav_config` (library defaults where absent)."""
    path = Path(checkpoint) / "config.json"
    top = json.loads(path.read_text())
    if "code2wav_config" not in top:
        raise ValueError(f"{path}: no code2wav_config")
    c = top["code2wav_config"]
    for key, supported in (("attention_bias", False), ("hidden_act", "silu")):
        if c.get(key, supported) != supported:
            raise ValueError(f"{path}: code2wav_config.{key}={c[key]!r} is not supported")
    values = {k: tuple(c[k]) if isinstance(c[k], list) else c[k] for k in KEYS if k in c}
    hidden = values.get("hidden_size", CodecConfig.hidden_size)
    heads = values.get("num_attention_heads", CodecConfig.num_attention_heads)
    rates = values.get("upsample_rates", CodecConfig.upsample_rates) + values.get("upsampling_ratios",
                                                                                  CodecConfig.upsampling_ratios)
    spf = 1
    for r in rates:
        spf *= r
    return CodecConfig(codebook_dim=hidden, latent_dim=hidden, head_dim=c.get("head_dim", hidden // heads),
                       decode_upsample_rate=spf, front_end="embedding", **values)


def load_omni_codec(checkpoint: Path) -> tuple[CodecConfig, Codec]:
    """The code2wav of a Qwen3-Omni checkpoint; strict both ways (a missing, misshapen or unused
    `code2wav.*` tensor is an error naming it)."""
    checkpoint = Path(checkpoint)
    config = codec_config(checkpoint)
    codec = Codec(config)
    state, used, available = {}, set(), {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            for key in keys:
                if key.startswith("code2wav."):
                    available[key] = f.get_tensor(key).float()
    for name, expected in codec.state_dict().items():
        key = f"code2wav.{name}"
        if key not in available:
            raise ValueError(f"{checkpoint.name}: missing tensor {key!r} needed by the vocoder")
        if available[key].shape != expected.shape:
            raise ValueError(f"{checkpoint.name}: {key!r} has shape {tuple(available[key].shape)}, "
                             f"expected {tuple(expected.shape)}")
        state[name] = available[key]
        used.add(key)
    unused = sorted(set(available) - used)
    if unused:
        raise ValueError(f"{checkpoint.name}: code2wav tensors this port does not use: {', '.join(unused)}")
    codec.load_state_dict(state, strict=True)
    return config, codec.eval()
