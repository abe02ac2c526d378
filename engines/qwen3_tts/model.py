"""Qwen3-TTS talker and residual code predictor, written for export.

A readable port of qwen-tts 0.1.1 `modeling_qwen3_tts.py` (talker + code predictor), shaped for
ONNX export and a runtime that owns its buffers:

- `Talker`: the weights of the talker graph (`engines.talker.TalkerStep`: T new rows per member over
  a KV cache the runtime allocated once -> last hidden, sampled code 0, the new K/V rows, which the
  runtime writes at each row's position; a decode step is T = 1 for a batch, a prefill T = the
  prompt for one member).
- `CodePredictorFrame`: the whole residual frame (groups 1..G-1) unrolled, with sampling inside,
  plus the codec-embedding sum that the next talker step takes as input.

The decoder layers are `engines.layers` (shared with the other talker families) and the sampling is
`engines.sampling`. The K cache is stored transposed, [B, Hkv, D, S], so decode attention is two
plain MatMuls over the cache with no transpose of the cache in the graph.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engines.layers import Stack
from engines.qwen3_tts.config import Qwen3TTSConfig
from engines.sampling import sample
from engines.weights import Checkpoint, Source, Weights, by_prefix, fake, renamed, stacked

# ----------------------------------------------------------------------------------------- graphs


class Talker(nn.Module):
    """Talker weights: the stack, codec head."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Stack(cfg.talker)
        self.codec_head = nn.Linear(cfg.talker.hidden, cfg.vocab, bias=False)
        self.eos = cfg.special["codec_eos"]


class CodePredictorFrame(nn.Module):
    """Groups 1..G-1 of one frame from the talker hidden and code 0; a fresh 16-slot cache per frame."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.cfg = cfg
        g = cfg.code_groups
        self.codec_embedding = nn.Embedding(cfg.vocab, cfg.talker.hidden)  # the talker's table
        self.model = Stack(cfg.predictor)
        self.cp_embedding = nn.ModuleList(nn.Embedding(cfg.codebook_size, cfg.talker.hidden) for _ in range(g - 1))
        self.lm_head = nn.ModuleList(nn.Linear(cfg.predictor.hidden, cfg.codebook_size, bias=False) for _ in range(g - 1))
        if cfg.predictor.hidden != cfg.talker.hidden:
            self.small_to_mtp_projection = nn.Linear(cfg.talker.hidden, cfg.predictor.hidden, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def forward(self, hidden, code0, temperature, top_k, top_p, noise):
        # hidden [B, H]; code0 [B]; noise [B, G-1, Vc]
        e0 = self.codec_embedding(code0)  # [B, H]
        codec_sum = e0
        x = self.small_to_mtp_projection(torch.stack((hidden, e0), dim=1))  # [B, 2, Hc]
        h, past = self.model.causal(x, torch.arange(2).unsqueeze(0))
        codes = []
        for g in range(self.cfg.code_groups - 1):
            code = sample(self.lm_head[g](h[:, -1]), temperature, top_k, top_p, noise[:, g])
            codes.append(code)
            e = self.cp_embedding[g](code)  # [B, H], unprojected for the talker's sum
            codec_sum = codec_sum + e
            if g + 1 < self.cfg.code_groups - 1:
                x = self.small_to_mtp_projection(e.unsqueeze(1))
                h, rows = self.model.causal(x, torch.tensor([[g + 2]]), past)
                past = [(torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)) for (pk, pv), (k, v) in zip(past, rows)]
        return torch.stack(codes, dim=1), codec_sum


# ----------------------------------------------------------------------------------------- weights

TALKER_KEYS = {"talker.model.": "talker.model.", "talker.codec_head.": "talker.codec_head."}
PREDICTOR_KEYS = {
    "predictor.codec_embedding.": "talker.model.codec_embedding.",
    "predictor.model.": "talker.code_predictor.model.",
    "predictor.cp_embedding.": "talker.code_predictor.model.codec_embedding.",
    "predictor.lm_head.": "talker.code_predictor.lm_head.",
    "predictor.small_to_mtp_projection.": "talker.code_predictor.small_to_mtp_projection.",
}
"""Module tensor names (the graphs' roots: `talker.`, `predictor.`) -> checkpoint key prefixes."""


def modules(cfg: Qwen3TTSConfig) -> tuple[Talker, CodePredictorFrame]:
    """The talker and code predictor with shapes but no weights (engines.weights.fake)."""
    return fake(lambda: Talker(cfg)), fake(lambda: CodePredictorFrame(cfg))


def weights(checkpoint: Path, cfg: Qwen3TTSConfig, talker: Talker, predictor: CodePredictorFrame) -> Weights:
    """Where the graphs' and the host tables' tensors come from in a Qwen3-TTS checkpoint; checked."""
    sources = {**_prefixed(talker, "talker.", TALKER_KEYS), **_prefixed(predictor, "predictor.", PREDICTOR_KEYS),
               **predictor_table_sources(cfg, "talker.code_predictor."),
               **projection_sources("text_projection", "talker.text_projection", cfg.text_hidden, cfg.text_hidden,
                                    cfg.talker.hidden),
               "text_embedding": renamed("talker.model.text_embedding.weight", (cfg.text_vocab, cfg.text_hidden)),
               "codec_embedding": renamed("talker.model.codec_embedding.weight", (cfg.vocab, cfg.talker.hidden))}
    result = Weights(Checkpoint(checkpoint), sources)
    result.check({"talker.": talker, "predictor.": predictor})
    return result


def _prefixed(module: nn.Module, prefix: str, keys: dict[str, str]) -> dict:
    return by_prefix(module, {m.removeprefix(prefix): k for m, k in keys.items()}, prefix)


def predictor_table_sources(cfg, prefix: str) -> dict[str, Source]:
    """The code predictor's host tables: its heads stacked [G-1, Hc, Vc] and its residual codec
    embeddings stacked [G-1, Vc, H] (checkpoint `<prefix>lm_head.{g}`, `<prefix>model.codec_embedding.{g}`)."""
    groups = range(cfg.code_groups - 1)
    return {"cp_heads": stacked([f"{prefix}lm_head.{g}.weight" for g in groups],
                                (cfg.codebook_size, cfg.predictor.hidden), transposed=True),
            "cp_codec_embedding": stacked([f"{prefix}model.codec_embedding.{g}.weight" for g in groups],
                                          (cfg.codebook_size, cfg.talker.hidden), transposed=False)}


def projection_sources(name: str, key: str, width_in: int, width: int, width_out: int) -> dict[str, Source]:
    """A two-layer projection MLP's tensors (`<key>.linear_fc1/2`), as `<name>.fc1/2.weight/bias`."""
    return {f"{name}.fc1.weight": renamed(f"{key}.linear_fc1.weight", (width, width_in)),
            f"{name}.fc1.bias": renamed(f"{key}.linear_fc1.bias", (width,)),
            f"{name}.fc2.weight": renamed(f"{key}.linear_fc2.weight", (width_out, width)),
            f"{name}.fc2.bias": renamed(f"{key}.linear_fc2.bias", (width_out,))}


TABLES = ("text_embedding", "text_projection.fc1.weight", "text_projection.fc1.bias", "text_projection.fc2.weight",
          "text_projection.fc2.bias", "codec_embedding", "cp_heads", "cp_codec_embedding")


def load_qwen3_tts(checkpoint: Path) -> tuple[Qwen3TTSConfig, Talker, CodePredictorFrame, dict[str, torch.Tensor]]:
    """Config, talker, code predictor (with their weights) and the host-side tables, for torch runs."""
    cfg = Qwen3TTSConfig.from_checkpoint(Path(checkpoint))
    talker, predictor = modules(cfg)
    source = weights(Path(checkpoint), cfg, talker, predictor)
    tables = {name: source.tensor(name) for name in TABLES}
    return cfg, source.load(talker, "talker."), source.load(predictor, "predictor."), tables  # type: ignore[return-value]
