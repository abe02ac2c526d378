"""Qwen3-Omni's code2wav as the shared streaming codec (`engines.qwen3_tts.codec.Codec` with the
`embedding` front end): config from the checkpoint's `code2wav_config`, weights from `code2wav.*`.

The library's `Qwen3OmniMoeCode2Wav.forward` returns 1920 x F - lead samples for F frames; the
streaming graph returns 1920 x F per call and the host drops each stream's first `lead_samples`
(555 at the released rates), so a stream decoded in windows equals the library's whole decode.
"""

from __future__ import annotations

import math
from pathlib import Path

from engines.config import Section
from engines.qwen3_tts.codec import Codec, CodecConfig, read_codec
from engines.weights import Checkpoint

SAMPLE_RATE = 24000
"""Hz: code2wav's output rate. No config key holds it; the library's generate returns 24 kHz audio."""


def codec_config(code2wav: Section) -> CodecConfig:
    """The codec config of a Qwen3-Omni checkpoint's `code2wav_config` section: its transformer is as
    wide as its embeddings (no codebook projections), and a frame is the product of its strides."""
    hidden = code2wav.need("hidden_size")
    strides = code2wav.need("upsample_rates", list) + code2wav.need("upsampling_ratios", list)
    return read_codec(code2wav, front_end="embedding", codebook_dim=hidden, latent_dim=hidden,
                      output_sample_rate=SAMPLE_RATE, decode_upsample_rate=math.prod(strides))


def load_omni_codec(checkpoint: Path, config: CodecConfig) -> Codec:
    """The code2wav of a Qwen3-Omni checkpoint (`config`: its code2wav_config); strict both ways (a
    missing, misshapen or unused `code2wav.*` tensor is an error naming it)."""
    store = Checkpoint(checkpoint)
    codec = Codec(config)
    available = {key for key in store.files if key.startswith("code2wav.")}
    targets = codec.state_dict()
    for name, target in targets.items():  # each copied into place as it is read
        key = f"code2wav.{name}"
        if key not in available:
            raise ValueError(f"{store.directory}: missing tensor {key!r} needed by the vocoder")
        if store.shape(key) != tuple(target.shape):
            raise ValueError(f"{store.where(key)} has shape {store.shape(key)}, expected {tuple(target.shape)}")
        target.copy_(store.read(key))
    unused = sorted(available - {f"code2wav.{name}" for name in targets})
    if unused:
        raise ValueError(f"{store.directory}: code2wav tensors this port does not use: {', '.join(unused)}")
    return codec.eval()
