"""Qwen3-Omni's talker (a MoE decoder) and its residual code predictor, written for export.

A port of transformers' `modeling_qwen3_omni_moe.py` (talker part). The talker's layers are
`engines.layers` blocks whose MLP is the sparse MoE with a gated shared expert (every talker layer
is MoE); its graph is the shared `engines.talker.TalkerStep`. Text positions make the interleaved
multimodal RoPE plain 1-D RoPE (the three position rows are equal). The code predictor is
Qwen3-TTS's frame (one lm_head and one codec embedding per residual group, no projection: the
predictor is as wide as the talker), so it is reused as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from engines.config import StackConfig
from engines.layers import Stack
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_tts.model import CodePredictorFrame


class OmniTalker(nn.Module):
    """Talker weights: the MoE stack and the codec head (`engines.talker.TalkerStep` is its graph)."""

    def __init__(self, cfg: Qwen3OmniConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Stack(cfg.talker, cfg.moe)
        self.codec_head = nn.Linear(cfg.talker.hidden, cfg.vocab, bias=False)
        self.eos = cfg.special["codec_eos"]


@dataclass(frozen=True)
class PredictorConfig:
    """What `CodePredictorFrame` reads of a family's config."""

    talker: StackConfig
    predictor: StackConfig
    vocab: int
    codebook_size: int
    code_groups: int


def load_qwen3_omni(checkpoint: Path) -> tuple[Qwen3OmniConfig, OmniTalker, CodePredictorFrame, dict[str, torch.Tensor]]:
    """Config, talker, code predictor and the host-side tables (the thinker's text embedding, the
    text and hidden projections, the talker's codec embedding) from a checkpoint directory. Only
    `talker.*`, `code2wav.*` and the thinker's `embed_tokens` are read of the weights."""
    from engines.qwen3_tts.model import _load, _need

    checkpoint = Path(checkpoint)
    cfg = Qwen3OmniConfig.from_checkpoint(checkpoint)
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors weights")
    wanted = ("talker.", "code2wav.", "thinker.model.embed_tokens.")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update({k: v.float() for k, v in load_file(f).items() if k.startswith(wanted)})
    talker = OmniTalker(cfg)
    _load(talker, weights, {"model.": "talker.model.", "codec_head.": "talker.codec_head."})
    for layer in talker.model.layers:
        layer.mlp.pack()
    predictor = CodePredictorFrame(PredictorConfig(cfg.talker, cfg.predictor, cfg.vocab, cfg.codebook_size,
                                                   cfg.code_groups))  # type: ignore[arg-type]
    _load(predictor, weights, {
        "codec_embedding.": "talker.model.codec_embedding.",
        "model.": "talker.code_predictor.model.",
        "cp_embedding.": "talker.code_predictor.model.codec_embedding.",
        "lm_head.": "talker.code_predictor.lm_head.",
    })
    tables = {"text_embedding": _need(weights, "thinker.model.embed_tokens.weight"),
              "codec_embedding": _need(weights, "talker.model.codec_embedding.weight")}
    for name in ("text_projection", "hidden_projection"):
        for part in ("fc1", "fc2"):
            for kind in ("weight", "bias"):
                tables[f"{name}.{part}.{kind}"] = _need(weights, f"talker.{name}.linear_{part}.{kind}")
    return cfg, talker.eval(), predictor.eval(), tables
