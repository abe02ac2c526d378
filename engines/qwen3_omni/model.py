"""Qwen3-Omni's talker (a MoE decoder) and its residual code predictor, written for export.

A port of transformers' `modeling_qwen3_omni_moe.py` (talker part). The talker's layers are
`engines.layers` blocks whose MLP is the sparse MoE with a gated shared expert (every talker layer
is MoE); its graph is the shared `engines.talker.TalkerStep`. Text positions make the interleaved
multimodal RoPE plain 1-D RoPE (the three position rows are equal). The code predictor is
Qwen3-TTS's frame (one lm_head and one codec embedding per residual group, no projection: the
predictor is as wide as the talker), so it is reused as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from engines.layers import MoEConfig, Stack, StackConfig, stack_config
from engines.qwen3_tts.model import CodePredictorFrame


@dataclass(frozen=True)
class Qwen3OmniConfig:
    talker: StackConfig
    moe: MoEConfig
    predictor: StackConfig
    vocab: int
    codebook_size: int
    code_groups: int
    thinker_hidden: int
    text_vocab: int
    accept_hidden_layer: int
    special: dict[str, int]
    speakers: dict[str, int]
    media: dict[str, int] = field(default_factory=dict)
    """Thinker ids whose rows are hidden states (audio, image, video placeholders)."""

    @classmethod
    def from_checkpoint(cls, checkpoint: Path) -> Qwen3OmniConfig:
        path = Path(checkpoint) / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"{path.name}: missing from the checkpoint")
        cfg = json.loads(path.read_text())
        t = _key(cfg, "talker_config")
        text, cp = _key(t, "text_config", "talker_config"), _key(t, "code_predictor_config", "talker_config")
        thinker = _key(_key(cfg, "thinker_config"), "text_config", "thinker_config")
        if cp.get("num_code_groups", t["num_code_groups"]) != t["num_code_groups"]:
            raise ValueError("config.json: code_predictor_config.num_code_groups differs from the talker's")
        return cls(
            talker=stack_config(text), predictor=stack_config(cp),
            moe=MoEConfig(experts=text["num_experts"], top_k=text["num_experts_per_tok"],
                          expert_width=text["moe_intermediate_size"],
                          shared_width=_key(text, "shared_expert_intermediate_size", "talker_config.text_config"),
                          norm_topk_prob=bool(text.get("norm_topk_prob", True))),
            vocab=text["vocab_size"], codebook_size=cp["vocab_size"], code_groups=t["num_code_groups"],
            thinker_hidden=t["thinker_hidden_size"], text_vocab=thinker["vocab_size"],
            accept_hidden_layer=t["accept_hidden_layer"],
            special={
                "codec_pad": t["codec_pad_id"], "codec_bos": t["codec_bos_id"], "codec_eos": t["codec_eos_token_id"],
                "codec_nothink": t["codec_nothink_id"], "codec_think_bos": t["codec_think_bos_id"],
                "codec_think_eos": t["codec_think_eos_id"],
                "tts_pad": cfg["tts_pad_token_id"], "tts_bos": cfg["tts_bos_token_id"],
                "tts_eos": cfg["tts_eos_token_id"], "im_start": cfg["im_start_token_id"],
                "im_end": cfg["im_end_token_id"], "system": cfg["system_token_id"], "user": cfg["user_token_id"],
                "assistant": cfg["assistant_token_id"],
            },
            speakers={name.lower(): int(i) for name, i in (t.get("speaker_id") or {}).items()},
            # the library's multimodal_mask reads the thinker's placeholder ids
            media={k: _key(cfg["thinker_config"], k, "thinker_config")
                   for k in ("audio_token_id", "image_token_id", "video_token_id")},
        )


def _key(d: dict, key: str, where: str = "") -> dict:
    if key not in d:
        raise KeyError(f"config.json: {where + ': ' if where else ''}missing key {key!r}")
    return d[key]


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
