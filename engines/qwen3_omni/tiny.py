"""Tiny random Qwen3-Omni checkpoints, made with transformers' own classes (no hub).

    config.json  generation_config.json  model.safetensors   (Qwen3OmniMoeForConditionalGeneration)
    tokenizer.json  vocab.json  merges.txt  tokenizer_config.json   (engines.tiny_text, + media pads)

The text tokenizer is the small byte-level BPE of `engines.tiny_text` with Qwen's special tokens and
the image/video placeholders; the thinker's vocabulary is its size and every token id in the config
(im_start/end, the tts tokens, the system/user/assistant role words, the media placeholders) is the
tokenizer's. The codec ids and speakers are the released checkpoint's; every width is tiny. The
shape variants differ in experts, layers and code groups. The library's random init leaves
code2wav's SnakeBeta and LayerScale near zero and its weights at std 0.02, which makes its waveform
~1e-8; they are redrawn (weights at 0.5 / sqrt(fan in)) so PCM comparisons mean something.
Deterministic from the seed."""

from __future__ import annotations

from pathlib import Path

from engines.tiny_text import write_text_tokenizer

VARIANTS = [
    # talker layers, experts, top-k, code groups, code predictor layers
    dict(layers=2, experts=4, top_k=2, groups=16, cp_layers=1),
    dict(layers=3, experts=8, top_k=3, groups=8, cp_layers=2),
    dict(layers=1, experts=6, top_k=1, groups=4, cp_layers=1),
]
REAL_LAYERS = 6
"""Talker layers of the real-dims synthesis benchmark's checkpoint (scripts/bench/synth.py): 6 of 20
(0.63 GB each in fp32) keep an fp32 artifact's talker small enough to run beside the others; the
export benchmark (scripts/bench/export.py) builds all 20."""
MEDIA_SPECIALS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
CODEC = dict(codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_nothink_id=2155,
             codec_think_bos_id=2156, codec_think_eos_id=2157,
             speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303})


def mrope(head_dim: int) -> dict:
    """Interleaved multimodal RoPE sections summing to head_dim / 2 (text positions make it 1-D RoPE)."""
    half = head_dim // 2
    return {"rope_type": "default", "mrope_section": [half - 2 * (half // 4), half // 4, half // 4], "interleaved": True}


def token_ids(tok) -> dict[str, int]:
    """The config's token ids, from the tokenizer (each must be one token)."""
    def one(text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise RuntimeError(f"the tiny tokenizer splits {text!r}")
        return ids[0]
    return {"im_start": one("<|im_start|>"), "im_end": one("<|im_end|>"), "tts_pad": one("<tts_pad>"),
            "tts_bos": one("<tts_text_bos>"), "tts_eos": one("<tts_text_eod>"), "system": one("system"),
            "user": one("user"), "assistant": one("assistant"), "audio": one("<|audio_pad|>"),
            "image": one("<|image_pad|>"), "video": one("<|video_pad|>"), "audio_start": one("<|audio_start|>"),
            "audio_end": one("<|audio_end|>"), "vision_start": one("<|vision_start|>"),
            "vision_end": one("<|vision_end|>")}


TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, thinker_hidden=32, thinker_heads=4, thinker_vocab=None,
            projection=48, expert_width=16, shared_width=24, cp_hidden=32, cp_intermediate=48, cp_heads=4,
            cp_kv_heads=2, code2wav=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, decoder_dim=32))
REAL = dict(hidden=1024, heads=16, kv_heads=2, head_dim=128, thinker_hidden=2048, thinker_heads=16,
            thinker_vocab=152064, projection=2048, expert_width=384, shared_width=768, cp_hidden=1024,
            cp_intermediate=3072, cp_heads=16, cp_kv_heads=8, code2wav={})
"""Qwen3-Omni-30B-A3B's talker, code predictor and code2wav widths (docs/dev/qwen3-omni.md §1); the
thinker keeps only its vocabulary and width (its embed_tokens feeds the talker) with one small layer."""


def tiny_config(ids: dict[str, int], vocab: int, variant: int = 0):
    return omni_config(ids, vocab, VARIANTS[variant], TINY)


def omni_config(ids: dict[str, int], vocab: int, v: dict, d: dict):
    """The model config: layer counts, experts and groups from `v`, widths from `d` (TINY or REAL)."""
    from transformers import Qwen3OmniMoeConfig

    media = dict(audio_token_id=ids["audio"], image_token_id=ids["image"], video_token_id=ids["video"],
                 vision_start_token_id=ids["vision_start"], audio_start_token_id=ids["audio_start"],
                 position_id_per_seconds=13)
    talker = dict(hidden_size=d["hidden"], num_attention_heads=d["heads"], num_key_value_heads=d["kv_heads"],
                  head_dim=d["head_dim"], rope_theta=1000000, rope_scaling=mrope(d["head_dim"]), norm_topk_prob=True)
    thinker = dict(talker, hidden_size=d["thinker_hidden"], num_attention_heads=d["thinker_heads"])
    return Qwen3OmniMoeConfig(
        thinker_config=dict(
            audio_config=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                              output_dim=d["thinker_hidden"], downsample_hidden_size=8, num_mel_bins=128,
                              n_window=50, n_window_infer=800),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                               out_hidden_size=d["thinker_hidden"], deepstack_visual_indexes=[0],
                               num_position_embeddings=16),
            text_config=dict(thinker, vocab_size=d["thinker_vocab"] or vocab, intermediate_size=64,
                             num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
            audio_end_token_id=ids["audio_end"], vision_end_token_id=ids["vision_end"], seconds_per_chunk=2,
            **media),
        talker_config=dict(
            text_config=dict(talker, vocab_size=3072, intermediate_size=d["projection"], num_hidden_layers=v["layers"],
                             num_experts=v["experts"], num_experts_per_tok=v["top_k"],
                             moe_intermediate_size=d["expert_width"], shared_expert_intermediate_size=d["shared_width"]),
            code_predictor_config=dict(vocab_size=2048, hidden_size=d["cp_hidden"], intermediate_size=d["cp_intermediate"],
                                       num_hidden_layers=v["cp_layers"], num_attention_heads=d["cp_heads"],
                                       num_key_value_heads=d["cp_kv_heads"], head_dim=d["head_dim"],
                                       num_code_groups=v["groups"], rope_theta=1000000),
            num_code_groups=v["groups"], thinker_hidden_size=d["thinker_hidden"], accept_hidden_layer=1,
            spatial_merge_size=2, **CODEC, **media),
        im_start_token_id=ids["im_start"], im_end_token_id=ids["im_end"], tts_pad_token_id=ids["tts_pad"],
        tts_bos_token_id=ids["tts_bos"], tts_eos_token_id=ids["tts_eos"], system_token_id=ids["system"],
        user_token_id=ids["user"], assistant_token_id=ids["assistant"],
        code2wav_config=dict(dict(codebook_size=2048, num_quantizers=v["groups"], sliding_window=72,
                                  upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2]), **d["code2wav"]),
    )


def build_model(seed: int, variant: int = 0, tokenizer_dir: Path | None = None, *, real_layers: int = 0,
                dtype: str = "float32"):
    """The tiny Qwen3OmniMoeForConditionalGeneration itself (eager attention, eval mode), with the tiny
    tokenizer written to `tokenizer_dir` (a temporary directory when None). `real_layers` > 0: the
    real widths (REAL) with that many talker layers instead (128 experts, top 6, 16 groups, code
    predictor 5 layers). The model is built in `dtype` (a torch dtype's name)."""
    import tempfile

    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from engines.tiny_weights import default_dtype

    if not 0 <= variant < len(VARIANTS):
        raise ValueError(f"qwen3_omni tiny variant must be 0..{len(VARIANTS) - 1}, got {variant}")
    with tempfile.TemporaryDirectory() as tmp:
        tok = write_text_tokenizer(Path(tokenizer_dir or tmp), MEDIA_SPECIALS)
    torch.manual_seed(seed)
    if real_layers:
        shape = dict(layers=real_layers, experts=128, top_k=6, groups=16, cp_layers=5)
        cfg = omni_config(token_ids(tok), tok.get_vocab_size(), shape, REAL)
    else:
        cfg = tiny_config(token_ids(tok), tok.get_vocab_size(), variant)
    cfg._attn_implementation = "eager"
    with default_dtype(getattr(torch, dtype)):
        model = Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("code2wav.") and name.endswith((".alpha", ".beta")):
                p.normal_(0, 0.1)
            elif name.startswith("code2wav.") and name.endswith((".gamma", "layer_scale.scale")):
                p.normal_(0.5, 0.1)
            elif name.startswith("code2wav.") and p.dim() >= 2 and "embedding" not in name:
                p.normal_(0, 0.5 * _fan_in(name, p) ** -0.5)  # the library's std 0.02 all but silences it
    return model


def build_tiny(out: Path | str, seed: int, variant: int = 0) -> Path:
    out = Path(out)
    build_model(seed, variant, tokenizer_dir=out).save_pretrained(out)
    return out


def build_real_dims(out: Path | str, seed: int, layers: int = REAL_LAYERS, dtype: str = "fp32",
                    shard_size: str | None = None) -> Path:
    """A random checkpoint with the real Qwen3-Omni-30B-A3B talker widths and `layers` of its 20 talker
    layers, the real code predictor and code2wav (for benchmarks: ~0.63 GB per talker layer in fp32).
    `dtype` bf16 with a `shard_size` ("2GB") saves it as the published checkpoint is: bf16 shards and
    model.safetensors.index.json, through save_pretrained."""
    out = Path(out)
    model = build_model(seed, 0, tokenizer_dir=out, real_layers=layers, dtype=DTYPES[dtype])
    model.save_pretrained(out, max_shard_size=shard_size or "100GB")
    return out


DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def _fan_in(name: str, p) -> int:
    """Inputs per output of a Linear / Conv1d weight [out, in, k], or of a ConvTranspose1d weight
    [in, out, k] (each output sees about in x 2 taps: its kernels are twice the stride)."""
    if p.dim() == 2:
        return p.shape[1]
    transposed = ".upsample." in name and name.endswith(".0.conv.weight") or name.endswith("block.1.conv.weight")
    return p.shape[0] * 2 if transposed else p.shape[1] * p.shape[2]
