"""The one talker graph every family exports: new rows over the runtime's KV cache, code 0 sampled.

A family's talker module supplies `model` (an `engines.layers.Stack`), `codec_head` and `eos` (the
code 0 that ends an utterance); docs/artifact.md has the graph's contract.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.layers import rope_tables
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
