"""A checkpoint whose code predictor agrees with its own drafts: for measuring speculative verify.

Random weights make the later heads' drafts almost never right, so speculative verify could only be
measured at zero acceptance. `make_agreeable` rewrites a checkpoint's code predictor so that drafts
are often right, keeping every shape (and so every byte a pass reads): its layers add nothing to the
residual stream (o_proj and down_proj zero), every residual group shares group 1's embedding table,
and every head scores a code by `strength` times its similarity to the hidden row that code's
embedding leaves, so a group tends to repeat the one before it. Greedy, every draft is accepted;
sampled, a temperature sets how often (docs: tests/talker/test_spec_verify.py, scripts/bench/weights.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PREFIX = "talker.code_predictor."


def make_agreeable(checkpoint: Path, out: Path, strength: float = 8.0) -> Path:
    """Copy the Qwen3-TTS `checkpoint` to `out` with its code predictor rewritten (above)."""
    from engines.qwen3_tts.model import load_qwen3_tts

    checkpoint, out = Path(checkpoint), Path(out)
    shutil.copytree(checkpoint, out, dirs_exist_ok=True)
    weights = load_file(str(out / "model.safetensors"))
    for name in weights:
        if name.startswith(PREFIX + "model.layers.") and name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])
    table = weights[PREFIX + "model.codec_embedding.0.weight"]
    _, _, predictor, _ = load_qwen3_tts(checkpoint)
    with torch.no_grad():  # the hidden each code's row leaves when the layers add nothing
        rows = predictor.model.norm(predictor.small_to_mtp_projection(table.to(torch.float32)))
    head = (strength * rows / (rows * rows).sum(-1, keepdim=True)).to(table.dtype)  # a code scores `strength` on its own row
    for g in range(predictor.cfg.code_groups - 1):
        weights[f"{PREFIX}model.codec_embedding.{g}.weight"] = table.clone()
        weights[f"{PREFIX}lm_head.{g}.weight"] = head.clone().contiguous()
    save_file(weights, str(out / "model.safetensors"))
    return out
