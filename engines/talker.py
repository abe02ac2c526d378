"""The talker and code-predictor graphs every family exports, and their export.

`TalkerStep` is the one talker graph: new rows over the runtime's KV cache, code 0 sampled. A
family's talker module supplies `model` (an `engines.layers.Stack`), `codec_head`, `eos` (the code 0
that ends an utterance) and `cfg` (`talker` stack config, `vocab`); its code predictor is
`engines.qwen3_tts.model.CodePredictorFrame`. docs/artifact.md has the graphs' contracts.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engines.layers import rope_tables
from engines.onnx import export_graph
from engines.sampling import process_code0, sample


class TalkerStep(nn.Module):
    """The one talker graph: T new rows per member over the runtime's KV cache, code 0 sampled from
    the last row. A decode step is B members x 1 row over the whole cache; a prefill is 1 member x
    the prompt's rows at position 0 (over a one-slot cache that the mask hides). One graph holds the
    weights once, and TensorRT builds it as one engine with a context and a generation profile."""

    def __init__(self, talker: nn.Module):
        super().__init__()
        self.talker = talker

    def forward(self, inputs_embeds, positions, seen, repetition_penalty, allow_eos,
                temperature, top_k, top_p, noise, *cache):
        # inputs_embeds [B, T, H]; positions [B] (of the first new row);
        # cache = past_keys_0 [B, Hkv, D, P], past_values_0 [B, Hkv, P, D], ...
        stack = self.talker.model
        t = inputs_embeds.shape[1]
        rows = positions.unsqueeze(1) + torch.arange(t).unsqueeze(0)  # [B, T]
        cos, sin = rope_tables(rows, stack.c.head_dim, stack.c.rope_theta)  # [B, T, D]
        slots = cache[1].shape[2]
        valid = (torch.arange(slots).unsqueeze(0) < positions.unsqueeze(1)).view(-1, 1, 1, slots)
        x = inputs_embeds
        new_rows = []
        for i, layer in enumerate(stack.layers):
            attn, k, v = layer.self_attn.extend(layer.input_layernorm(x), cos, sin,
                                                cache[2 * i], cache[2 * i + 1], valid)
            x = layer.finish(x, attn)
            new_rows += [k.transpose(2, 3), v]  # [B, Hkv, D, T], [B, Hkv, T, D]
        hidden = stack.norm(x[:, -1])  # [B, H]
        logits = process_code0(self.talker.codec_head(hidden), seen, repetition_penalty, allow_eos, self.talker.eos)
        code0 = sample(logits, temperature, top_k, top_p, noise)
        return (hidden, code0, *new_rows)


SAMPLING_INPUTS = ["temperature", "top_k", "top_p", "noise"]
CODE0_INPUTS = ["seen", "repetition_penalty", "allow_eos"]


def kv_names(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]


def sampling_examples(batch: int, vocab: int, code0: bool) -> tuple:
    torch.manual_seed(0)
    head = (torch.zeros(batch, vocab), torch.ones(batch), torch.ones(batch, dtype=torch.bool)) if code0 else ()
    return head + (
        torch.full((batch,), 0.9), torch.full((batch,), 50, dtype=torch.long),
        torch.ones(batch), torch.rand(batch, vocab),
    )


def export_talker(talker: nn.Module, path: Path, max_seq: int) -> dict:
    """One graph for prefill and decode: batch B, new rows T and cache slots P all dynamic."""
    c = talker.cfg.talker
    b, t = 2, 3
    cache = []
    for _ in range(c.layers):
        cache += [torch.randn(b, c.kv_heads, c.head_dim, max_seq), torch.randn(b, c.kv_heads, max_seq, c.head_dim)]
    args = (torch.randn(b, t, c.hidden), torch.tensor([3, 7]), *sampling_examples(b, talker.cfg.vocab, code0=True),
            *cache)
    inputs = ["inputs_embeds", "positions", *CODE0_INPUTS, *SAMPLING_INPUTS, *kv_names("past", c.layers)]
    outputs = ["hidden", "code0", *kv_names("new", c.layers)]
    batch = torch.export.Dim("B", min=1, max=1024)
    rows = torch.export.Dim("T", min=1, max=32768)
    slots = torch.export.Dim("P", min=1, max=32768)
    past = tuple(({0: batch, 3: slots} if i % 2 == 0 else {0: batch, 2: slots}) for i in range(len(cache)))
    dynamic = ({0: batch, 1: rows},) + ({0: batch},) * 8 + (past,)
    return export_graph(TalkerStep(talker), args, path, inputs, outputs, dynamic)


def export_predictor(predictor: nn.Module, path: Path) -> dict:
    cfg = predictor.cfg
    b = 2
    args = (
        torch.randn(b, cfg.talker.hidden), torch.tensor([5, 9]),
        torch.full((b,), 0.9), torch.full((b,), 50, dtype=torch.long), torch.ones(b),
        torch.rand(b, cfg.code_groups - 1, cfg.codebook_size),
    )
    inputs = ["hidden", "code0", *SAMPLING_INPUTS]
    batch = torch.export.Dim("B", min=1, max=1024)
    dynamic = ({0: batch},) * 6
    return export_graph(predictor, args, path, inputs, ["codes", "codec_sum"], dynamic)
