"""Tiny random-weight Qwen3-TTS (12 Hz, CustomVoice) checkpoints, built with qwen-tts's own classes.

`build_tiny(out_dir, seed, variant)` writes a checkpoint directory in the real layout, which
`qwen_tts.Qwen3TTSModel.from_pretrained(out_dir)` loads offline:

    config.json  model.safetensors  generation_config.json
    tokenizer.json  vocab.json  merges.txt  tokenizer_config.json
    speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

The model is `Qwen3TTSForConditionalGeneration` (talker + code predictor) and the speech tokenizer
`Qwen3TTSTokenizerV2Model` (Mimi encoder + decoder), saved with `save_pretrained`, so key names and
config fields are the ones qwen-tts writes. Special ids, languages and speaker rows are the real
checkpoint values; only the sizes shrink. `VARIANTS` lists shapes that differ on purpose, so nothing
downstream can hard-code one.

Weights: the default HF init leaves degenerate weights (zero RVQ codebooks decode every code to the
same vector; zero SnakeBeta parameters; 1e-6 ConvNeXt gammas), so every tensor of the state dict is
re-initialized here from its own generator seeded by (seed, variant, key). Same seed and variant give
byte-identical safetensors; the gains are chosen so greedy decoding varies from frame to frame, logits
are well separated (top-1 vs top-2 gap typically >> 1e-3), and the vocoder output follows the codes
without sitting on the +-1 clamp.

The text tokenizer is a small byte-level BPE trained here (nothing may be downloaded) with Qwen2's
pre-tokenizer, normalizer and decoder, plus Qwen's special tokens appended after the BPE vocabulary.

`build_real_dims(out_dir, seed)` writes the same thing at the Qwen3-TTS-12Hz-0.6B sizes (random
weights, about 4 GB in fp32) for benchmarks; its text vocabulary keeps the real embedding size
(151936 rows) while the tokenizer stays the small one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn

from engines.reference import import_qwen_tts

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

# Qwen's special tokens, in Qwen's order, appended after the BPE vocabulary. The TTS names are the
# real ones (`<tts_pad>`, `<tts_text_bos>`, `<tts_text_eod>`, ids 151671..151673 in Qwen's vocab).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BPE_VOCAB_SIZE = 768  # 256 byte symbols + merges; the special tokens come on top


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


# ----------------------------------------------------------------------------------- public API


def build_tiny(out_dir: Path | str, seed: int, variant: int = 0) -> Path:
    """Write a tiny random Qwen3-TTS CustomVoice checkpoint of `VARIANTS[variant]` to `out_dir`.

    Deterministic: the same (seed, variant) gives byte-identical files. Returns `out_dir`.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant {variant!r}; known: {sorted(VARIANTS)}")
    return _build(Path(out_dir), seed, VARIANTS[variant], tag=str(variant))


def build_real_dims(out_dir: Path | str, seed: int) -> Path:
    """Write a random checkpoint with the real Qwen3-TTS-12Hz-0.6B-CustomVoice sizes to `out_dir`.

    For benchmarks only: fp32, ~3.6 GB + 0.7 GB (speech tokenizer) on disk, ~45 s and ~5 GB RAM to
    build. Deterministic like `build_tiny`. tts_model_size is "0b6", so qwen-tts ignores `instruct`.
    Returns `out_dir`.
    """
    return _build(Path(out_dir), seed, REAL_0_6B, tag="0.6b")


# ---------------------------------------------------------------------------------------- build


def _build(out: Path, seed: int, dims: Dims, tag: str) -> Path:
    import_qwen_tts()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import EncodecFeatureExtractor
    from transformers.modeling_utils import no_init_weights

    out.mkdir(parents=True, exist_ok=True)
    tok = write_text_tokenizer(out)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    text_vocab = dims.text_vocab or tok.get_vocab_size()
    if text_vocab < tok.get_vocab_size():
        raise ValueError(f"text_vocab {text_vocab} is smaller than the tokenizer ({tok.get_vocab_size()})")

    config = Qwen3TTSConfig(
        talker_config=_talker_config(dims, text_vocab),
        speaker_encoder_config={"enc_dim": dims.hidden},
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=dims.model_size,
        tts_model_type="custom_voice",
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        assistant_token_id=tok.token_to_id("assistant"),
    )
    # Skip the HF init: every tensor is overwritten by `_reinit` anyway, and at the real sizes the
    # default init would double the build time.
    with no_init_weights():
        model = Qwen3TTSForConditionalGeneration(config)
    _reinit(model, seed, tag, "model")
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    del model
    # Qwen3TTSSpeakerEncoderConfig takes no **kwargs, so the `model_type` key HF serializes into it
    # breaks loading; the real checkpoints store only these two fields.
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    saved["speaker_encoder_config"] = {"enc_dim": dims.hidden, "sample_rate": SAMPLE_RATE}
    _write_json(out / "config.json", saved)
    # qwen-tts reads this file as the generate defaults; HF may have written its own version.
    _write_json(out / "generation_config.json", GENERATION_CONFIG)

    st_dir = out / "speech_tokenizer"
    st_config = Qwen3TTSTokenizerV2Config(
        encoder_config=_mimi_config(dims),
        decoder_config=_decoder_config(dims),
        encoder_valid_num_quantizers=dims.groups,
        input_sample_rate=SAMPLE_RATE,
        output_sample_rate=SAMPLE_RATE,
        decode_upsample_rate=SAMPLES_PER_FRAME,
        encode_downsample_rate=SAMPLES_PER_FRAME,
    )
    with no_init_weights():
        speech = Qwen3TTSTokenizerV2Model(st_config)
    _reinit(speech, seed, tag, "speech_tokenizer")
    speech.save_pretrained(st_dir, safe_serialization=True, max_shard_size="100GB")
    del speech
    EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0).save_pretrained(st_dir)
    return out


def _talker_config(d: Dims, text_vocab: int) -> dict:
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
        "codec_language_id": dict(LANGUAGES), "spk_id": dict(SPEAKERS),
        "spk_is_dialect": dict(SPEAKER_DIALECT),
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
_GAINS = (
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
_NORM_MEANS = ((r"\.(q|k)_norm\.weight$", 2.0),)


def _reinit(model: nn.Module, seed: int, tag: str, part: str) -> None:
    """Overwrite every tensor of `model.state_dict()` deterministically; fail on any unknown kind."""
    stored = set(model.state_dict())
    covered: set[str] = set()
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            for name, t in tensors:
                key = f"{mod_name}.{name}" if mod_name else name
                if key not in stored:
                    continue  # a non-persistent buffer (rotary tables): computed, not stored
                gen = torch.Generator().manual_seed(_tensor_seed(seed, tag, f"{part}/{key}"))
                t.copy_(_init_value(module, name, key, t, gen))
                covered.add(key)
    missing = stored - covered
    if missing:
        raise RuntimeError(f"tensors left without an init rule: {sorted(missing)[:10]}")


def _tensor_seed(seed: int, tag: str, key: str) -> int:
    digest = hashlib.sha256(f"{seed}/{tag}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _normal(shape: torch.Size, std: float, gen: torch.Generator, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * std + mean


def _uniform(shape: torch.Size, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=gen) * (hi - lo) + lo


def _init_value(module: nn.Module, name: str, key: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    kind = type(module).__name__
    shape = t.shape
    gain = next((g for pattern, g in _GAINS if re.search(pattern, key)), 1.0)
    if kind.endswith("RMSNorm") or (kind == "LayerNorm" and name == "weight"):
        mean = next((m for pattern, m in _NORM_MEANS if re.search(pattern, key)), 1.0)
        return _normal(shape, 0.1, gen, mean=mean)
    if name == "bias" and kind in ("Linear", "Conv1d", "ConvTranspose1d", "LayerNorm"):
        return _normal(shape, 0.02, gen)
    if kind == "Linear":
        return _normal(shape, gain / math.sqrt(shape[1]), gen)
    if kind == "Conv1d":  # weight [out, in / groups, k]
        return _normal(shape, gain / math.sqrt(shape[1] * shape[2]), gen)
    if kind == "ConvTranspose1d":
        # weight [in, out, k]: every output sample sums in * k / stride taps
        return _normal(shape, gain / math.sqrt(shape[0] * shape[2] / module.stride[0]), gen)
    if kind == "Embedding":
        return _normal(shape, 1.0, gen)
    if kind == "SnakeBeta":  # log-parameters: alpha, beta = exp(.) around 1
        return _normal(shape, 0.2, gen)
    if name == "scale" and kind.endswith("LayerScale"):
        return _uniform(shape, 0.1, 0.3, gen)
    if name == "gamma" and kind.endswith("ConvNeXtBlock"):
        return _uniform(shape, 0.1, 0.3, gen)
    if kind == "EuclideanCodebook":
        return _codebook(name, t, gen, sum_name="embedding_sum")
    if kind == "MimiEuclideanCodebook":
        if name == "initialized":
            return torch.ones(shape)
        return _codebook(name, t, gen, sum_name="embed_sum")
    raise RuntimeError(f"no init rule for {key} ({kind}.{name}, shape {tuple(shape)})")


def _codebook(name: str, t: torch.Tensor, gen: torch.Generator, sum_name: str) -> torch.Tensor:
    """EMA codebook: embedding = embedding_sum / cluster_usage. Usage positive, embeddings ~N(0, 1)."""
    if name == "cluster_usage":
        return _uniform(t.shape, 0.5, 2.0, gen)
    if name == sum_name:
        # Scale rows by a usage drawn from the same seed stream, so the ratio stays ~N(0, 1).
        usage = _uniform(t.shape[:1], 0.5, 2.0, gen)
        return _normal(t.shape, 1.0, gen) * usage[:, None]
    raise RuntimeError(f"unexpected codebook tensor {name}")


# ------------------------------------------------------------------------------- text tokenizer


def write_text_tokenizer(out: Path) -> Tokenizer:
    """Train the small byte-level BPE and write tokenizer.json, vocab.json, merges.txt and
    tokenizer_config.json (Qwen2Tokenizer). Returns the `tokenizers.Tokenizer`."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for role in ("assistant", "user", "\n"):
        # qwen-tts slices the prompt by token position (role = ids[:3], trailer = ids[-5:]).
        if len(tok.encode(role, add_special_tokens=False).ids) != 1:
            raise RuntimeError(f"the tiny tokenizer splits {role!r}; the corpus needs more of it")

    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    model = json.loads(tok.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    _write_json(out / "vocab.json", vocab)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    _write_json(out / "tokenizer_config.json", _tokenizer_config(tok))
    return tok


def _tokenizer_config(tok: Tokenizer) -> dict:
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------- corpus

_ENGLISH = """\
Hello, world! This is a small test of the speech engine.
The quick brown fox jumps over the lazy dog.
She said she would be here by noon, but the train was late.
Please turn left at the next corner and walk for two minutes.
It's a beautiful day; the sun is shining and the birds are singing.
I can't believe it's already the end of the year.
We'll meet at the station at half past seven.
They're going to the market to buy bread, cheese, and apples.
Would you like a cup of tea or a glass of water?
The meeting has been moved to Thursday afternoon.
Your order number is ready for pickup at the front desk.
The temperature today will reach a high of twenty degrees.
Good morning! How are you feeling today?
Thank you very much for your help with the project.
The library closes at nine o'clock on weekdays.
Remember to save your work before you shut down the computer.
A journey of a thousand miles begins with a single step.
The assistant reads the message aloud to the user.
The user asks the assistant a question about the weather.
Speech synthesis turns written text into natural sounding audio.
Every sentence should sound clear, calm, and friendly.
Numbers like 3.14, 42, and 1,000,000 are read digit by digit.
Call me at 555-0123 or send an email before Friday.
The price is $19.99, plus tax, which makes about $21.50.
On March 5th, 2024, the team shipped version 2.1 of the app.
Wait... what did you just say?
Yes! No? Maybe - I honestly don't know.
The train leaves from platform 9 at 10:45 in the morning.
Open the window, please; it's getting warm in here.
He whispered: "Don't forget the keys."
The children laughed and ran across the green field.
Our flight was delayed by three hours because of the storm.
Please speak slowly and clearly so everyone can understand.
The recipe needs two eggs, a cup of flour, and some sugar.
Mountains, rivers, forests, and deserts cover the land.
Music can change the mood of a room in a single moment.
The old clock on the wall stopped at midnight.
Can you hear me now? The connection seems to be better.
Turn the volume down a little, it's too loud.
Let's try that again from the beginning.
The museum is open from Tuesday to Sunday.
Scientists study the stars, the planets, and the moon.
Take the second exit at the roundabout.
This voice is warm, gentle, and easy to listen to.
Battery level is low; please connect the charger.
The package will arrive between 2 pm and 6 pm.
Reading aloud helps with learning new words.
What time is it in Tokyo, London, and New York?
The cat sat quietly on the windowsill, watching the rain.
I'd like to book a table for four at eight o'clock.
"""

_CHINESE = """\
你好，世界！这是一个语音合成的测试。
今天天气很好，我们一起去公园散步吧。
请在下一个路口左转，然后直走两分钟。
其实我真的有发现，我是一个特别善于观察别人情绪的人。
我叫通义千问，是阿里云的开源大模型。
火车将在上午十点四十五分从九号站台出发。
谢谢你的帮助，我们明天见。
这本书非常有意思，我已经读了三遍了。
请说慢一点，让大家都能听清楚。
北京的秋天很美，天空又高又蓝。
他说：“别忘了带钥匙。”
会议改到星期四下午三点。
你吃饭了吗？我们一起去吃饭吧。
音乐可以在一瞬间改变房间的气氛。
"""

_ROLE_LINES = [
    "assistant", "user", "system", "the assistant", "the user",
    "assistant\n", "user\n", "system\n",
]


def corpus_lines() -> list[str]:
    """The embedded training corpus: English and Chinese sentences, role words, digits and symbols.

    Repetition is deliberate: it decides which merges BPE learns (the role words must end up as
    single tokens), and it is part of the deterministic recipe, so change it only on purpose.
    """
    english = _ENGLISH.splitlines()
    chinese = _CHINESE.splitlines()
    lines: list[str] = []
    lines += english * 2
    lines += chinese * 2
    lines += _ROLE_LINES * 40
    for i in range(120):  # numbers, dates, times and punctuation in varied shapes
        lines.append(f"Item {i}: {i * 37 % 1000}.{i % 10}% — {2000 + i % 30}-{1 + i % 12:02d}-{1 + i % 28:02d}, "
                     f"{i % 24:02d}:{i * 7 % 60:02d} ({english[i % len(english)][:24]}...)")
        lines.append(f"{chinese[i % len(chinese)]} 第{i}号，共{i * 3}元。")
    return lines
