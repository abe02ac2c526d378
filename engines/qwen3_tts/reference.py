"""The public qwen-tts 0.1.1 pipeline, run the way the tests need it (CPU, fp32, greedy on request).

Everything goes through qwen-tts's own wrapper `Qwen3TTSModel.generate_custom_voice`, so prompt
building, speaker/dialect/language handling, sampling and decoding are the reference's, not ours.
The only addition is that the talker codes the wrapper throws away are captured on the way out.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch


def import_qwen_tts() -> types.ModuleType:
    """Import `qwen_tts`, stubbing torchaudio when no working torchaudio is installed.

    qwen-tts imports `torchaudio.compliance.kaldi` at import time, but only its 25 Hz tokenizer uses
    it, and no torchaudio wheel loads beside the torch this project pins. Empty stand-in modules let
    the import succeed; the 12 Hz models never touch them.
    """
    if "qwen_tts" in sys.modules:
        return sys.modules["qwen_tts"]
    try:
        import torchaudio.compliance.kaldi  # noqa: F401
    except (ImportError, OSError):  # OSError: a torchaudio wheel built for another torch
        _stub_torchaudio()
    import qwen_tts

    return qwen_tts


def _stub_torchaudio() -> None:
    names = ["torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"]
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


def load_reference(checkpoint_dir: Path | str) -> Any:
    """Load a checkpoint directory with `qwen_tts.Qwen3TTSModel.from_pretrained`: CPU, float32,
    eager attention (the plain matmul/softmax path, so runs are reproducible)."""
    qwen_tts = import_qwen_tts()
    model = qwen_tts.Qwen3TTSModel.from_pretrained(
        str(checkpoint_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model.model.eval()
    return model


def reference_synthesize(
    model: Any,
    text: str,
    *,
    speaker: str | None = None,
    language: str = "auto",
    instruct: str | None = None,
    max_frames: int,
    greedy: bool = True,
    non_streaming_mode: bool = True,
    seed: int | None = None,
    repetition_penalty: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Synthesize one utterance with the reference; return (codes int64 [N, G], pcm float32 [N * 1920]).

    `greedy` sets do_sample=False for the talker and the code predictor and, unless
    `repetition_penalty` is given, repetition_penalty=1.0; otherwise the checkpoint's
    generation_config.json applies (with `seed` seeding torch first). At most `max_frames` frames:
    the talker may emit `max_frames + 1` tokens, and the last one never gets a frame. Fewer frames
    come back when the talker emits eos (never among its first 2 tokens: qwen-tts sets
    min_new_tokens=2).

    `speaker=None` leaves the speaker row out of the prompt (the wrapper accepts it). `instruct` is
    dropped by the wrapper when the checkpoint's tts_model_size is "0b6".
    """
    kwargs = _generate_kwargs(max_frames, greedy, repetition_penalty)
    return _capturing(model, seed, lambda: model.generate_custom_voice(
        text=text, speaker=speaker, language=language, instruct=instruct,
        non_streaming_mode=non_streaming_mode, **kwargs))


def reference_design(
    model: Any,
    text: str,
    instruct: str,
    *,
    language: str = "auto",
    max_frames: int,
    greedy: bool = True,
    non_streaming_mode: bool = True,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A VoiceDesign checkpoint's speech in the voice `instruct` describes, through the wrapper's
    own `generate_voice_design` (no speaker; `non_streaming_mode` defaults to the wrapper's True):
    (codes [N, G], pcm), as `reference_synthesize` returns them."""
    kwargs = _generate_kwargs(max_frames, greedy, None)
    return _capturing(model, seed, lambda: model.generate_voice_design(
        text=text, instruct=instruct, language=language, non_streaming_mode=non_streaming_mode, **kwargs))


def reference_clone(
    model: Any,
    text: str,
    ref_audio: np.ndarray,
    ref_text: str | None,
    *,
    language: str = "auto",
    max_frames: int,
    greedy: bool = True,
    non_streaming_mode: bool = False,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Clone the voice of `ref_audio` (float32, 24 kHz mono) with the reference's own
    `create_voice_clone_prompt` + `generate_voice_clone`: x-vector only when `ref_text` is None,
    in-context (ICL) otherwise. `non_streaming_mode` defaults to the wrapper's own default for
    cloning (False: the dual-track text layout).

    Returns (codes [N, G] of the new speech, its pcm (the wrapper's cut after decoding the reference
    codes and the new ones together), the x-vector [H], the reference codes [T, G] or None)."""
    x_vector_only = ref_text is None
    (item,) = model.create_voice_clone_prompt(ref_audio=(ref_audio, 24000), ref_text=ref_text,
                                              x_vector_only_mode=x_vector_only)
    kwargs = _generate_kwargs(max_frames, greedy, None)
    codes, pcm = _capturing(model, seed, lambda: model.generate_voice_clone(
        text=text, language=language, voice_clone_prompt=[item], non_streaming_mode=non_streaming_mode, **kwargs))
    xvector = item.ref_spk_embedding.detach().cpu().float().numpy()
    ref_codes = None if item.ref_code is None else item.ref_code.detach().cpu().to(torch.int64).numpy()
    return codes, pcm, xvector, ref_codes


def _generate_kwargs(max_frames: int, greedy: bool, repetition_penalty: float | None) -> dict[str, Any]:
    if max_frames < 1:
        raise ValueError("max_frames must be >= 1")
    kwargs: dict[str, Any] = {"max_new_tokens": max_frames + 1}
    if greedy:
        kwargs.update(do_sample=False, subtalker_dosample=False)
        kwargs["repetition_penalty"] = 1.0 if repetition_penalty is None else repetition_penalty
    elif repetition_penalty is not None:
        kwargs["repetition_penalty"] = repetition_penalty
    return kwargs


def _capturing(model: Any, seed: int | None, call) -> tuple[np.ndarray, np.ndarray]:
    """Run `call()` (one utterance through the wrapper), capturing the talker codes its `generate`
    returns (the wrapper throws them away): (codes [N, G], pcm)."""
    captured: list[list[torch.Tensor]] = []
    inner = model.model
    generate = inner.generate

    def capture(*args: Any, **kw: Any):
        codes_list, hiddens = generate(*args, **kw)
        captured.append(codes_list)
        return codes_list, hiddens

    inner.generate = capture  # instance attribute shadows the method for this one call
    try:
        if seed is not None:
            torch.manual_seed(seed)
        wavs, _ = call()
    finally:
        del inner.generate
    if len(captured) != 1 or len(captured[0]) != 1:
        raise RuntimeError(f"expected one generate call for one utterance, got {len(captured)}")
    codes = captured[0][0].detach().cpu().to(torch.int64).numpy()
    pcm = np.asarray(wavs[0], dtype=np.float32)
    return codes, pcm


def reference_token_ids(model: Any, text: str, instruct: str | None = None) -> tuple[list[int], list[int] | None]:
    """The text ids the wrapper feeds: the assistant prompt and the optional instruct prompt."""
    ids = model._tokenize_texts([model._build_assistant_text(text)])[0][0].tolist()
    if not instruct:
        return ids, None
    return ids, model._tokenize_texts([model._build_instruct_text(instruct)])[0][0].tolist()
