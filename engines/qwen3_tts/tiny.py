"""Tiny random-weight Qwen3-TTS (12 Hz, CustomVoice or Base) checkpoints, built with qwen-tts's own classes.

`build_tiny(out_dir, seed, variant, kind)` writes a checkpoint directory in the real layout, which
`qwen_tts.Qwen3TTSModel.from_pretrained(out_dir)` loads offline:

    config.json  model.safetensors  generation_config.json
    tokenizer.json  vocab.json  merges.txt  tokenizer_config.json
    speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

The model is `Qwen3TTSForConditionalGeneration` (talker + code predictor) and the speech tokenizer
`Qwen3TTSTokenizerV2Model` (Mimi encoder + decoder), saved with `save_pretrained`, so key names and
config fields are the ones qwen-tts writes. Special ids, languages and speaker rows are the real
checkpoint values; only the sizes shrink. `VARIANTS` lists shapes that differ on purpose, so nothing
downstream can hard-code one.

Weights: every tensor of the state dict is re-initialized (`engines.tiny_weights`) from its own
generator seeded by (seed, variant, key). Same seed and variant give byte-identical safetensors; the
gains below are chosen so greedy decoding varies from frame to frame, logits are well separated
(top-1 vs top-2 gap typically >> 1e-3), and the vocoder output follows the codes without sitting on
the +-1 clamp. The text tokenizer is the small byte-level BPE of `engines.tiny_text`.

`build_real_dims(out_dir, seed)` writes the same thing at the Qwen3-TTS-12Hz-0.6B sizes (random
weights, about 4 GB in fp32) for benchmarks; its text vocabulary keeps the real embedding size
(151936 rows) while the tokenizer stays the small one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from engines.tiny_text import SPECIAL_TOKENS, write_json, write_text_tokenizer

# ----------------------------------------------------------------------------------- real values

CODEC_VOCAB = 3072  # talker vocabulary: codes 0..2047, specials and speaker rows 2048..3071
CODEBOOK_SIZE = 2048  # code predictor vocabulary / speech-tokenizer codebook size
CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "spanish": 2054, "japanese": 2058,
    "french": 2061, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071,
    "sichuan_dialect": 2062, "beijing_dialect": 2074,
}
SPEAKERS = {"serena": 3066, "vivian": 3065, "ryan": 3061, "aiden": 2861, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECT: dict[str, str | bool] = {
    "serena": False, "vivian": False, "ryan": False, "aiden": False,
    "eric": "sichuan_dialect", "dylan": "beijing_dialect",
}
# The checkpoint's generation_config.json (qwen-tts reads it as the wrapper's defaults).
GENERATION_CONFIG = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
    "subtalker_top_k": 50, "max_new_tokens": 8192,
}
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920  # prod(upsample_rates (8,5,4,3)) * prod(upsampling_ratios (2,2))

# ------------------------------------------------------------------------------------ variants


@dataclass(frozen=True)
class Dims:
    """Every size a checkpoint build needs. `text_vocab=None` means "the tokenizer's size"."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    text_hidden: int
    cp_hidden: int
    cp_layers: int
    cp_heads: int
    cp_kv_heads: int
    cp_head_dim: int
    cp_intermediate: int
    groups: int
    # speech-tokenizer decoder
    st_codebook_dim: int = 32
    st_latent: int = 64
    st_hidden: int = 32
    st_layers: int = 1
    st_heads: int = 2
    st_head_dim: int = 16
    st_intermediate: int = 64
    st_decoder_dim: int = 64
    text_vocab: int | None = None
    model_size: str = "tiny"  # qwen-tts drops `instruct` when this is a substring of "0b6"
    real_mimi: bool = False  # the real Mimi encoder sizes instead of a tiny one


VARIANTS: dict[int, Dims] = {
    # the default / built-in demo; cp hidden == talker hidden -> Identity small_to_mtp_projection
    0: Dims(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, text_hidden=64,
            cp_hidden=64, cp_layers=2, cp_heads=4, cp_kv_heads=2, cp_head_dim=16, cp_intermediate=128,
            groups=4),
    # cp hidden != talker hidden -> Linear small_to_mtp_projection (like 1.7B); MHA code predictor
    1: Dims(hidden=96, layers=3, heads=6, kv_heads=3, head_dim=16, intermediate=192, text_hidden=80,
            cp_hidden=48, cp_layers=2, cp_heads=4, cp_kv_heads=4, cp_head_dim=12, cp_intermediate=96,
            groups=8, st_codebook_dim=48, st_latent=48, st_hidden=48, st_layers=2, st_heads=3,
            st_decoder_dim=96),
    # one layer, MQA, the real group count
    2: Dims(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64, text_hidden=48,
            cp_hidden=32, cp_layers=1, cp_heads=2, cp_kv_heads=1, cp_head_dim=16, cp_intermediate=64,
            groups=16),
    # deeper talker, 4:1 GQA, Linear projection down to the code predictor
    3: Dims(hidden=128, layers=4, heads=8, kv_heads=2, head_dim=16, intermediate=256, text_hidden=64,
            cp_hidden=64, cp_layers=3, cp_heads=4, cp_kv_heads=2, cp_head_dim=16, cp_intermediate=128,
            groups=6, st_intermediate=96),
}

# Qwen3-TTS-12Hz-0.6B-CustomVoice (reference notes section 4.1 / 4.3).
REAL_0_6B = Dims(
    hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072, text_hidden=2048,
    cp_hidden=1024, cp_layers=5, cp_heads=16, cp_kv_heads=8, cp_head_dim=128, cp_intermediate=3072,
    groups=16, st_codebook_dim=512, st_latent=1024, st_hidden=512, st_layers=8, st_heads=16,
    st_head_dim=64, st_intermediate=1024, st_decoder_dim=1536, text_vocab=151936, model_size="0b6",
    real_mimi=True,
)
# Qwen3-TTS-12Hz-1.7B: twice as wide, the code predictor as the 0.6B's behind a Linear projection.
REAL_1_7B = replace(REAL_0_6B, hidden=2048, intermediate=6144, model_size="1b7")
REAL = {"0.6b": REAL_0_6B, "1.7b": REAL_1_7B}


# ----------------------------------------------------------------------------------- public API


KINDS = ("custom_voice", "voice_design", "base")
"""custom_voice: built-in speakers (rows of the codec embedding). voice_design: no speakers, the
voice described in `instruct` (generate_voice_design). base: no built-in speakers, a speaker
encoder (ECAPA-TDNN) for voice cloning; the speech tokenizer's encoder serves both."""


def build_tiny(out_dir: Path | str, seed: int, variant: int = 0, kind: str = "custom_voice") -> Path:
    """Write a tiny random Qwen3-TTS checkpoint (`kind`: CustomVoice, VoiceDesign or Base) of
    `VARIANTS[variant]` to `out_dir`.

    Deterministic: the same (seed, variant, kind) gives byte-identical files. Returns `out_dir`.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant {variant!r}; known: {sorted(VARIANTS)}")
    return _build(Path(out_dir), seed, VARIANTS[variant], tag=str(variant), kind=kind)


def build_real_dims(out_dir: Path | str, seed: int, kind: str = "custom_voice", size: str = "0.6b",
                    dtype: str = "fp32", shard_size: str | None = None) -> Path:
    """Write a random checkpoint with the real Qwen3-TTS-12Hz sizes (`size` 0.6b or 1.7b) to `out_dir`.

    For benchmarks only. `dtype` bf16 with a `shard_size` ("1GB") saves the model as the published
    checkpoints are (bf16 shards and model.safetensors.index.json, through save_pretrained); fp32 is
    one file (0.6B: ~3.6 GB + 0.7 GB for the speech tokenizer, which stays fp32 in one file). The
    model is built in `dtype`. Deterministic like `build_tiny`. The 0.6B's tts_model_size is "0b6",
    so qwen-tts ignores `instruct` for its CustomVoice model. Returns `out_dir`.
    """
    if size not in REAL:
        raise ValueError(f"unknown real size {size!r}; known: {', '.join(REAL)}")
    return _build(Path(out_dir), seed, REAL[size], tag=size, kind=kind, dtype=DTYPES[dtype], shard_size=shard_size)


# ---------------------------------------------------------------------------------------- build


DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""Checkpoint dtypes by name (torch dtype names, so this module imports without torch)."""


def _build(out: Path, seed: int, dims: Dims, tag: str, kind: str, dtype: str = "float32",
           shard_size: str | None = None) -> Path:
    import torch

    from engines.qwen3_tts.reference import import_qwen_tts
    from engines.tiny_weights import default_dtype, reinit

    import_qwen_tts()
    from qwen_tts.core import Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration
    from transformers import EncodecFeatureExtractor
    from transformers.modeling_utils import no_init_weights

    out.mkdir(parents=True, exist_ok=True)
    config, st_config = configs(dims, kind, write_text_tokenizer(out))
    # Skip the HF init: every tensor is overwritten by `_reinit` anyway, and at the real sizes the
    # default init would double the build time.
    with no_init_weights(), default_dtype(getattr(torch, dtype)):
        model = Qwen3TTSForConditionalGeneration(config)
    reinit(model, seed, tag, "model", gains=GAINS, norm_means=NORM_MEANS)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_size or "100GB")
    del model
    fix_speaker_encoder_config(out, dims)
    # qwen-tts reads this file as the generate defaults; HF may have written its own version.
    write_json(out / "generation_config.json", GENERATION_CONFIG)

    st_dir = out / "speech_tokenizer"
    with no_init_weights():
        speech = Qwen3TTSTokenizerV2Model(st_config)
    reinit(speech, seed, tag, "speech_tokenizer", gains=GAINS, norm_means=NORM_MEANS)
    speech.save_pretrained(st_dir, safe_serialization=True, max_shard_size="100GB")
    del speech
    EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0).save_pretrained(st_dir)
    return out


def configs(dims: Dims, kind: str, tok, classes: tuple | None = None) -> tuple:
    """The model's and the speech tokenizer's config objects, made with qwen-tts's own classes
    (`classes` = (Qwen3TTSConfig, Qwen3TTSTokenizerV2Config); imported from qwen_tts when None)."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}; known: {', '.join(KINDS)}")
    if classes is None:
        from qwen_tts.core import Qwen3TTSTokenizerV2Config
        from qwen_tts.core.models import Qwen3TTSConfig

        classes = (Qwen3TTSConfig, Qwen3TTSTokenizerV2Config)
    model_class, speech_class = classes
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    text_vocab = dims.text_vocab or tok.get_vocab_size()
    if text_vocab < tok.get_vocab_size():
        raise ValueError(f"text_vocab {text_vocab} is smaller than the tokenizer ({tok.get_vocab_size()})")
    config = model_class(
        talker_config=_talker_config(dims, text_vocab, kind),
        speaker_encoder_config=_speaker_encoder_config(dims),
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=dims.model_size,
        tts_model_type=kind,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        assistant_token_id=tok.token_to_id("assistant"),
    )
    speech = speech_class(
        encoder_config=_mimi_config(dims),
        decoder_config=_decoder_config(dims),
        encoder_valid_num_quantizers=dims.groups,
        input_sample_rate=SAMPLE_RATE,
        output_sample_rate=SAMPLE_RATE,
        decode_upsample_rate=SAMPLES_PER_FRAME,
        encode_downsample_rate=SAMPLES_PER_FRAME,
    )
    return config, speech


def fix_speaker_encoder_config(out: Path, dims: Dims) -> None:
    """Qwen3TTSSpeakerEncoderConfig takes no **kwargs, so the `model_type` key HF serializes into it
    breaks loading; the real checkpoints store only enc_dim and sample_rate (the real encoder sizes
    are the class's defaults), tiny ones their smaller sizes too."""
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    saved["speaker_encoder_config"] = _speaker_encoder_config(dims)
    write_json(out / "config.json", saved)


def _speaker_encoder_config(d: Dims) -> dict:
    if d.real_mimi:  # the real sizes
        return {"enc_dim": d.hidden, "sample_rate": SAMPLE_RATE}
    return {"enc_dim": d.hidden, "sample_rate": SAMPLE_RATE, "enc_channels": [32, 32, 32, 32, 96],
            "enc_attention_channels": 16, "enc_res2net_scale": 4, "enc_se_channels": 16}


def _talker_config(d: Dims, text_vocab: int, kind: str) -> dict:
    half = d.head_dim // 2
    side = round(half * 20 / 64)  # the real [24, 20, 20] split of 64 rotary pairs, scaled
    code_predictor = {
        "vocab_size": CODEBOOK_SIZE, "hidden_size": d.cp_hidden, "intermediate_size": d.cp_intermediate,
        "num_hidden_layers": d.cp_layers, "num_attention_heads": d.cp_heads,
        "num_key_value_heads": d.cp_kv_heads, "head_dim": d.cp_head_dim, "hidden_act": "silu",
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "attention_bias": False, "num_code_groups": d.groups,
    }
    return {
        "code_predictor_config": code_predictor,
        "vocab_size": CODEC_VOCAB, "hidden_size": d.hidden, "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [half - 2 * side, side, side],
                         "rope_type": "default"},
        "attention_bias": False, "num_code_groups": d.groups, "text_hidden_size": d.text_hidden,
        "text_vocab_size": text_vocab, "position_id_per_seconds": 13,
        **CODEC_IDS,
        "codec_language_id": dict(LANGUAGES),
        "spk_id": dict(SPEAKERS) if kind == "custom_voice" else {},
        "spk_is_dialect": dict(SPEAKER_DIALECT) if kind == "custom_voice" else {},
    }


def _decoder_config(d: Dims) -> dict:
    return {
        "codebook_size": CODEBOOK_SIZE, "codebook_dim": d.st_codebook_dim, "latent_dim": d.st_latent,
        "hidden_size": d.st_hidden, "num_hidden_layers": d.st_layers,
        "num_attention_heads": d.st_heads, "num_key_value_heads": d.st_heads, "head_dim": d.st_head_dim,
        "intermediate_size": d.st_intermediate, "decoder_dim": d.st_decoder_dim,
        "num_quantizers": d.groups, "sliding_window": 72, "max_position_embeddings": 8000,
        "rope_theta": 10000, "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "hidden_act": "silu",
        "attention_bias": False,
    }


def _mimi_config(d: Dims) -> dict:
    """The Mimi encoder (only used for voice cloning); 24 kHz in, 12.5 Hz codes out."""
    common = {"sampling_rate": SAMPLE_RATE, "frame_rate": 12.5, "codebook_size": CODEBOOK_SIZE,
              "upsampling_ratios": [8, 6, 5, 4], "use_causal_conv": True}
    if d.real_mimi:
        return {**common, "num_quantizers": 32}
    return {
        **common, "hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
        "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
        "num_quantizers": max(2 * d.groups, 8), "upsample_groups": 32,
    }


# -------------------------------------------------------------------------------------- weights

# Gain overrides by key pattern (first `re.search` match wins); the default gain of 1 keeps
# activations near unit scale. Why each one:
GAINS = (
    (r"^talker\.codec_head\.weight$", 2.5),  # well separated code-0 logits
    (r"^talker\.code_predictor\.lm_head\.", 2.5),  # ... and residual-code logits
    (r"self_attn\.o_proj\.weight$", 2.0),  # attention must matter next to the input row (context, speaker)
    # the vocoder: keep the residual sums and upsampling blocks from growing the signal, and put the
    # output well inside the [-1, 1] clamp
    (r"^decoder\.decoder\.\d+\.block\.\d+\.conv2\.conv\.weight$", 0.35),
    (r"^decoder\.decoder\.\d+\.block\.1\.conv\.weight$", 0.65),
    (r"^decoder\.decoder\.6\.conv\.weight$", 0.25),
)
# RMSNorm weight means by key pattern (default 1): per-head q/k norms above 1 sharpen attention,
# which otherwise averages the context away at random init.
NORM_MEANS = ((r"\.(q|k)_norm\.weight$", 2.0),)
