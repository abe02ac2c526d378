"""Tiny Qwen3-TTS checkpoints (engines.qwen3_tts.tiny) and the public reference run over them (engines.qwen3_tts.reference)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("qwen_tts") is None:
    pytest.skip("qwen-tts is not installed", allow_module_level=True)

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from engines.qwen3_tts.reference import reference_synthesize, reference_token_ids
from engines.qwen3_tts.tiny import (
    CODEC_IDS,
    GENERATION_CONFIG,
    LANGUAGES,
    REAL_0_6B,
    SAMPLES_PER_FRAME,
    SPEAKERS,
    VARIANTS,
    _talker_config,
    build_tiny,
)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------- the build


def test_same_seed_gives_identical_bytes_and_other_seeds_differ(tmp_path: Path) -> None:
    a = _files(build_tiny(tmp_path / "a", seed=7))
    b = _files(build_tiny(tmp_path / "b", seed=7))
    c = _files(build_tiny(tmp_path / "c", seed=8))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["speech_tokenizer/model.safetensors"] != c["speech_tokenizer/model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_layout_and_special_ids(checkpoints) -> None:
    root = checkpoints(0)
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "vocab.json", "merges.txt", "tokenizer_config.json", "speech_tokenizer/config.json",
                 "speech_tokenizer/model.safetensors", "speech_tokenizer/preprocessor_config.json"):
        assert (root / name).is_file(), name
    cfg = json.loads((root / "config.json").read_text())
    talker = cfg["talker_config"]
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    assert cfg["model_type"] == "qwen3_tts"
    assert cfg["tts_model_type"] == "custom_voice"
    assert cfg["tokenizer_type"] == "qwen3_tts_tokenizer_12hz"
    assert cfg["im_start_token_id"] == tok.token_to_id("<|im_start|>")
    assert cfg["im_end_token_id"] == tok.token_to_id("<|im_end|>")
    assert cfg["tts_pad_token_id"] == tok.token_to_id("<tts_pad>")
    assert cfg["tts_bos_token_id"] == tok.token_to_id("<tts_text_bos>")
    assert cfg["tts_eos_token_id"] == tok.token_to_id("<tts_text_eod>")
    assert talker["text_vocab_size"] == tok.get_vocab_size()
    assert talker["vocab_size"] == 3072
    assert talker["code_predictor_config"]["vocab_size"] == 2048
    assert {k: talker[k] for k in CODEC_IDS} == CODEC_IDS
    assert talker["codec_language_id"] == LANGUAGES
    assert talker["spk_id"] == SPEAKERS
    assert talker["spk_is_dialect"]["dylan"] == "beijing_dialect"
    assert json.loads((root / "generation_config.json").read_text()) == GENERATION_CONFIG
    st = json.loads((root / "speech_tokenizer/config.json").read_text())
    assert st["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert st["decode_upsample_rate"] == SAMPLES_PER_FRAME
    assert st["decoder_config"]["num_quantizers"] == talker["num_code_groups"]
    assert st["decoder_config"]["codebook_size"] == 2048


def test_weights_are_not_degenerate(checkpoints) -> None:
    root = checkpoints(0)
    for path in (root / "model.safetensors", root / "speech_tokenizer/model.safetensors"):
        for key, t in load_file(str(path)).items():
            if key.endswith("codebook.initialized"):
                continue  # a Mimi flag, 1 by design
            assert np.isfinite(t).all(), key
            assert t.size == 1 or t.std() > 0, f"{key} is constant"
    st = load_file(str(root / "speech_tokenizer/model.safetensors"))
    usage = st["decoder.quantizer.rvq_first.vq.layers.0._codebook.cluster_usage"]
    codebook = st["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"] / usage[:, None]
    assert (usage > 0).all()
    assert np.linalg.norm(codebook[0] - codebook[1]) > 0.1  # different codes decode differently


def test_real_dims_config_matches_the_0_6b_checkpoint() -> None:
    talker = _talker_config(REAL_0_6B, 151936, "custom_voice")
    cp = talker["code_predictor_config"]
    assert (talker["num_hidden_layers"], talker["hidden_size"], talker["intermediate_size"]) == (28, 1024, 3072)
    assert (talker["num_attention_heads"], talker["num_key_value_heads"], talker["head_dim"]) == (16, 8, 128)
    assert (talker["text_hidden_size"], talker["text_vocab_size"], talker["num_code_groups"]) == (2048, 151936, 16)
    assert talker["rope_scaling"]["mrope_section"] == [24, 20, 20]
    assert (cp["num_hidden_layers"], cp["hidden_size"], cp["num_key_value_heads"]) == (5, 1024, 8)


# ------------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_loads(tiny_reference, variant: int) -> None:
    dims = VARIANTS[variant]
    model = tiny_reference(variant)
    talker = model.model.talker
    assert talker.config.hidden_size == dims.hidden
    assert talker.config.num_code_groups == dims.groups
    assert len(talker.model.layers) == dims.layers
    projection = type(talker.code_predictor.small_to_mtp_projection).__name__
    assert projection == ("Identity" if dims.cp_hidden == dims.hidden else "Linear")
    assert model.model.speech_tokenizer.model.decoder.config.num_quantizers == dims.groups
    assert set(model.get_supported_speakers()) == set(SPEAKERS)


def _check_output(codes: np.ndarray, pcm: np.ndarray, groups: int, max_frames: int) -> None:
    n = codes.shape[0]
    assert codes.dtype == np.int64 and pcm.dtype == np.float32
    assert codes.shape == (n, groups)
    assert 1 <= n <= max_frames
    assert ((codes >= 0) & (codes < 2048)).all()
    assert pcm.shape == (n * SAMPLES_PER_FRAME,)
    assert np.abs(pcm).max() <= 1.0
    assert (np.abs(pcm) >= 0.999).mean() < 0.01  # not sitting on the clamp
    assert pcm.std() > 0.01


@pytest.mark.parametrize(
    "speaker, language, instruct",
    [("vivian", "english", None), (None, "auto", None), ("dylan", "chinese", "Speak slowly."), ("eric", "auto", None)],
)
def test_greedy_synthesis(tiny_reference, speaker, language, instruct) -> None:
    model = tiny_reference(0)
    codes, pcm = reference_synthesize(model, "Hello, world! 你好。", speaker=speaker, language=language,
                                      instruct=instruct, max_frames=6)
    _check_output(codes, pcm, groups=4, max_frames=6)
    assert len(set(codes[:, 0].tolist())) > 1  # greedy codes vary from frame to frame
    again, pcm_again = reference_synthesize(model, "Hello, world! 你好。", speaker=speaker, language=language,
                                            instruct=instruct, max_frames=6)
    assert np.array_equal(codes, again) and np.array_equal(pcm, pcm_again)


def test_prompt_parts_change_the_codes(tiny_reference) -> None:
    model = tiny_reference(0)
    base, _ = reference_synthesize(model, "Hello", speaker="vivian", language="english", max_frames=4)
    for kw in ({"speaker": "ryan", "language": "english"}, {"speaker": "vivian", "language": "german"},
               {"speaker": "vivian", "language": "english", "instruct": "Whisper."}):
        other, _ = reference_synthesize(model, "Hello", max_frames=4, **kw)
        assert not np.array_equal(base, other), kw


def test_max_frames_one_gives_one_frame(tiny_reference) -> None:
    # max_new_tokens = 2 talker tokens; eos is masked for both (min_new_tokens=2); the last gets no frame.
    codes, pcm = reference_synthesize(tiny_reference(0), "Hi.", speaker="aiden", max_frames=1)
    assert codes.shape == (1, 4) and pcm.shape == (SAMPLES_PER_FRAME,)


def test_sampling_is_reproducible_with_a_seed(tiny_reference) -> None:
    model = tiny_reference(0)
    a, _ = reference_synthesize(model, "Hello", speaker="serena", max_frames=4, greedy=False, seed=3)
    b, _ = reference_synthesize(model, "Hello", speaker="serena", max_frames=4, greedy=False, seed=3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("variant", [1, 2])
def test_other_variants_synthesize(tiny_reference, variant: int) -> None:
    codes, pcm = reference_synthesize(tiny_reference(variant), "Good morning.", speaker="ryan",
                                      language="english", max_frames=3)
    _check_output(codes, pcm, groups=VARIANTS[variant].groups, max_frames=3)


# ------------------------------------------------------------------------------- the tokenizer


@pytest.mark.parametrize(
    "text",
    [
        "<|im_start|>assistant\nHello, world! 你好。<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nSpeak happily, please!<|im_end|>\n",
        "<|im_start|>assistant\nI can't pay $3.14 — don't you?  Tabs\tand\r\nlines<|im_end|>\n",
        "CamelCaseWord HTTPServer a/b/c 😀 Ünïcödé e\u0301 <tts_pad><tts_text_bos><tts_text_eod>",
    ],
)
def test_tokenizer_json_matches_the_processor(checkpoints, tiny_reference, text: str) -> None:
    tok = Tokenizer.from_file(str(checkpoints(0) / "tokenizer.json"))
    processor = tiny_reference(0).processor
    expected = processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()
    assert tok.encode(text, add_special_tokens=False).ids == expected


def test_prompt_slicing_assumptions_hold(checkpoints, tiny_reference) -> None:
    # qwen-tts takes ids[:3] as the role and drops ids[-5:]; both need single-token role words.
    tok = Tokenizer.from_file(str(checkpoints(0) / "tokenizer.json"))
    ids, instruct_ids = reference_token_ids(tiny_reference(0), "Hello.", "Be calm.")
    assert [tok.id_to_token(i) for i in ids[:3]] == ["<|im_start|>", "assistant", "Ċ"]
    assert [tok.id_to_token(i) for i in ids[-5:]] == ["<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ"]
    assert tok.decode(ids[3:-5]) == "Hello."
    assert [tok.id_to_token(i) for i in instruct_ids[:3]] == ["<|im_start|>", "user", "Ċ"]


def test_a_base_checkpoint_has_a_speaker_encoder_and_its_custom_twins_speech_tokenizer(checkpoints, tmp_path):
    """Base: tts_model_type "base", no built-in speakers, a speaker encoder that qwen-tts loads and
    runs; the speech tokenizer is byte for byte the CustomVoice twin's (the built-in artifact takes
    its clone encoder from its Base twin); deterministic like every tiny build."""
    from engines.qwen3_tts.reference import load_reference
    from engines.tiny import build_tiny

    base = checkpoints(1, kind="base")
    config = json.loads((base / "config.json").read_text())
    assert config["tts_model_type"] == "base" and config["talker_config"]["spk_id"] == {}
    assert config["speaker_encoder_config"]["enc_dim"] == config["talker_config"]["hidden_size"]
    twin = checkpoints(1)
    assert (base / "speech_tokenizer/model.safetensors").read_bytes() == \
        (twin / "speech_tokenizer/model.safetensors").read_bytes()
    again = build_tiny(tmp_path / "again", 0, 1, kind="base")
    assert (again / "model.safetensors").read_bytes() == (base / "model.safetensors").read_bytes()
    model = load_reference(base)
    t = np.arange(24000) / 24000
    xvector = model.model.extract_speaker_embedding(np.sin(2 * np.pi * 200 * t).astype(np.float32) * 0.3, 24000)
    assert tuple(xvector.shape) == (config["talker_config"]["hidden_size"],) and float(xvector.abs().max()) > 0
    with pytest.raises(ValueError, match="unknown checkpoint kind 'voice_clone'"):
        build_tiny(tmp_path / "vc", 0, 0, kind="voice_clone")


def test_every_rms_norm_runs_as_one_onnx_runtime_kernel(artifacts, tmp_path) -> None:
    """The norms export as x / sqrt(mean(x^2) + eps) * w, the form ONNX Runtime's optimizer fuses into
    one SimplifiedLayerNormalization (x * rsqrt(...) is left as six kernels: measurably slower in
    the code predictor's 15 passes a frame)."""
    from collections import Counter

    import onnx
    import onnxruntime as ort

    art = artifacts(0)
    for graph in ("talker", "code_predictor", "vocoder"):
        exported = Counter(n.op_type for n in onnx.load(str(art / f"{graph}.onnx")).graph.node)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.optimized_model_filepath = str(tmp_path / f"{graph}.onnx")
        ort.InferenceSession(str(art / f"{graph}.onnx"), opts, providers=["CPUExecutionProvider"])
        fused = Counter(n.op_type for n in onnx.load(str(tmp_path / f"{graph}.onnx")).graph.node)
        norms = exported["ReduceMean"]
        assert norms > 0 and fused["SimplifiedLayerNormalization"] == norms and not fused["ReduceMean"], graph
