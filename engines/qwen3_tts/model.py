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
from safetensors.torch import load_file
from torch import nn

from engines.layers import Stack
from engines.qwen3_tts.config import Qwen3TTSConfig
from engines.sampling import sample

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


# ----------------------------------------------------------------------------------------- loading


def load_qwen3_tts(checkpoint: Path) -> tuple[Qwen3TTSConfig, Talker, CodePredictorFrame, dict[str, torch.Tensor]]:
    """Config, talker, code predictor and the host-side tables, from a checkpoint directory.

    Every weight the modules need must be present: a missing key is an error naming it.
    """
    checkpoint = Path(checkpoint)
    cfg = Qwen3TTSConfig.from_checkpoint(checkpoint)
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update({k: v.float() for k, v in load_file(f).items()})

    talker = Talker(cfg)
    _load(talker, weights, {"model.": "talker.model.", "codec_head.": "talker.codec_head."})
    predictor = CodePredictorFrame(cfg)
    _load(predictor, weights, {
        "codec_embedding.": "talker.model.codec_embedding.",
        "model.": "talker.code_predictor.model.",
        "cp_embedding.": "talker.code_predictor.model.codec_embedding.",
        "lm_head.": "talker.code_predictor.lm_head.",
        "small_to_mtp_projection.": "talker.code_predictor.small_to_mtp_projection.",
    })
    tables = {
        "text_embedding": _need(weights, "talker.model.text_embedding.weight"),
        "text_projection.fc1.weight": _need(weights, "talker.text_projection.linear_fc1.weight"),
        "text_projection.fc1.bias": _need(weights, "talker.text_projection.linear_fc1.bias"),
        "text_projection.fc2.weight": _need(weights, "talker.text_projection.linear_fc2.weight"),
        "text_projection.fc2.bias": _need(weights, "talker.text_projection.linear_fc2.bias"),
        "codec_embedding": _need(weights, "talker.model.codec_embedding.weight"),
    }
    return cfg, talker.eval(), predictor.eval(), tables


def _need(weights: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in weights:
        raise KeyError(f"model.safetensors: missing weight {key!r}")
    return weights[key]


def _load(module: nn.Module, weights: dict[str, torch.Tensor], prefixes: dict[str, str]) -> None:
    state = {}
    for name, param in module.state_dict().items():
        src = next((p + name[len(m):] for m, p in prefixes.items() if name.startswith(m)), None)
        if src is None:
            raise KeyError(f"no checkpoint prefix maps module weight {name!r}")
        tensor = _need(weights, src)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"model.safetensors: {src} has shape {tuple(tensor.shape)}, config implies {tuple(param.shape)}")
        state[name] = tensor
    module.load_state_dict(state, strict=True)
