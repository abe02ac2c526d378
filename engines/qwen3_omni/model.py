"""Qwen3-Omni's talker (a MoE decoder) and its residual code predictor, written for export.

A port of transformers' `modeling_qwen3_omni_moe.py` (talker part). The talker's layers are
`engines.layers` blocks whose MLP is the sparse MoE with a gated shared expert (every talker layer
is MoE); its graph is the shared `engines.talker.TalkerStep`. Text positions make the interleaved
multimodal RoPE plain 1-D RoPE (the three position rows are equal). The code predictor is
Qwen3-TTS's frame (one lm_head and one codec embedding per residual group, no projection: the
predictor is as wide as the talker), so it is reused as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engines.config import StackConfig
from engines.layers import Stack
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_tts.model import CodePredictorFrame, predictor_table_sources, projection_sources
from engines.weights import Checkpoint, Source, Weights, by_prefix, fake, renamed, stacked


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


TALKER = "talker.model."
PREDICTOR_KEYS = {
    "predictor.codec_embedding.": "talker.model.codec_embedding.",
    "predictor.model.": "talker.code_predictor.model.",
    "predictor.cp_embedding.": "talker.code_predictor.model.codec_embedding.",
    "predictor.lm_head.": "talker.code_predictor.lm_head.",
}
"""Module tensor names (the graphs' roots: `talker.`, `predictor.`) -> checkpoint key prefixes."""
EXPERTS = re.compile(r"^talker\.model\.layers\.(\d+)\.mlp\.experts_(gate|up|down)$")
TABLES = ("text_embedding", "text_projection.fc1.weight", "text_projection.fc1.bias", "text_projection.fc2.weight",
          "text_projection.fc2.bias", "codec_embedding", "cp_heads", "cp_codec_embedding", "hidden_projection.fc1.weight",
          "hidden_projection.fc1.bias", "hidden_projection.fc2.weight", "hidden_projection.fc2.bias")


def modules(cfg: Qwen3OmniConfig) -> tuple[OmniTalker, CodePredictorFrame]:
    """The talker and code predictor with shapes but no weights (engines.weights.fake)."""
    predictor = PredictorConfig(cfg.talker, cfg.predictor, cfg.vocab, cfg.codebook_size, cfg.code_groups)
    return fake(lambda: OmniTalker(cfg)), fake(lambda: CodePredictorFrame(predictor))  # type: ignore[arg-type]


def weights(checkpoint: Path, cfg: Qwen3OmniConfig, talker: OmniTalker, predictor: CodePredictorFrame) -> Weights:
    """Where the graphs' and the host tables' tensors come from in a Qwen3-Omni checkpoint; checked.
    Only `talker.*` and the thinker's `embed_tokens` are read (code2wav: engines.qwen3_omni.codec)."""
    store = Checkpoint(checkpoint)
    t = cfg.talker
    sources = {**by_prefix(talker, {"model.": TALKER, "codec_head.": "talker.codec_head."}, "talker."),
               **by_prefix(predictor, {m.removeprefix("predictor."): k for m, k in PREDICTOR_KEYS.items()}, "predictor."),
               **predictor_table_sources(cfg, "talker.code_predictor."),
               **projection_sources("text_projection", "talker.text_projection", cfg.thinker_hidden, t.intermediate,
                                    t.hidden),
               **projection_sources("hidden_projection", "talker.hidden_projection", cfg.thinker_hidden,
                                    t.intermediate, t.hidden),
               "text_embedding": renamed("thinker.model.embed_tokens.weight", (cfg.text_vocab, cfg.thinker_hidden)),
               "codec_embedding": renamed("talker.model.codec_embedding.weight", (cfg.vocab, t.hidden))}
    for name in list(sources):
        if (found := EXPERTS.match(name)) is not None:
            sources[name] = experts(store, cfg, int(found.group(1)), found.group(2))
    result = Weights(store, sources)
    result.check({"talker.": talker, "predictor.": predictor})
    return result


def experts(store: Checkpoint, cfg: Qwen3OmniConfig, layer: int, proj: str) -> Source:
    """One layer's experts of one projection, stacked as the MoE reads them ([E, H, I] for gate and
    up, [E, I, H] for down): from the per-expert tensors `experts.{e}.{proj}_proj.weight` that the
    published checkpoints and transformers' default save hold, or from transformers 5.x's fused
    `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]."""
    e, h, i = cfg.moe.experts, cfg.talker.hidden, cfg.moe.expert_width
    base = f"{TALKER}layers.{layer}.mlp.experts"
    fused = f"{base}.gate_up_proj" if proj != "down" else f"{base}.down_proj"
    if fused in store:
        if proj == "down":
            return Source((fused,), (e, h, i), (e, i, h), lambda ts: ts[0].transpose(1, 2).contiguous())
        half = slice(0, i) if proj == "gate" else slice(i, 2 * i)
        return Source((fused,), (e, 2 * i, h), (e, h, i), lambda ts: ts[0][:, half].transpose(1, 2).contiguous())
    shape = (h, i) if proj == "down" else (i, h)
    return stacked([f"{base}.{n}.{proj}_proj.weight" for n in range(e)], shape, transposed=True)


def load_qwen3_omni(checkpoint: Path) -> tuple[Qwen3OmniConfig, OmniTalker, CodePredictorFrame, dict[str, torch.Tensor]]:
    """Config, talker, code predictor (with their weights) and the host-side tables (the thinker's
    text embedding, the text and hidden projections, the talker's codec embedding), for torch runs."""
    cfg = Qwen3OmniConfig.from_checkpoint(Path(checkpoint))
    talker, predictor = modules(cfg)
    source = weights(Path(checkpoint), cfg, talker, predictor)
    tables = {name: source.tensor(name) for name in TABLES}
    return cfg, source.load(talker, "talker."), source.load(predictor, "predictor."), tables  # type: ignore[return-value]
