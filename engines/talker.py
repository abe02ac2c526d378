"""The talker and code-predictor graphs every family exports, and their export.

`TalkerStep` is the one talker graph: new rows over the runtime's KV cache, code 0 sampled.
`CodePredictorPass` is the one code-predictor graph: new rows over the predictor's own KV cache, one
residual group's code sampled with that group's head. A frame is G-1 passes (`predict_frame` drives
them as the runtime does), so each weight is read by one product of the graph and stored once (a
quantized weight must be: engines/quantize.py). A family's talker module supplies `model` (an
`engines.layers.Stack`), `codec_head`, `eos` (the code 0 that ends an utterance) and `cfg` (`talker`
stack config, `vocab`); its code predictor's weights are `engines.qwen3_tts.model.CodePredictorFrame`.
docs/artifact.md has the graphs' contracts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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

    def forward(self, inputs_embeds, positions, slots, seen, repetition_penalty, allow_eos,
                temperature, top_k, top_p, noise, *cache):
        # inputs_embeds [B, T, H]; positions [B] (of the first new row); slots [L]: only its length is
        # read, the cache slots attended (the first L of P); cache = past_keys_0 [B, Hkv, D, P],
        # past_values_0 [B, Hkv, P, D], ...
        hidden, new_rows = extend(self.talker.model, inputs_embeds, positions, cache, slots.shape[0])
        logits = process_code0(self.talker.codec_head(hidden), seen, repetition_penalty, allow_eos, self.talker.eos)
        code0 = sample(logits, temperature, top_k, top_p, noise)
        return (hidden, code0, *new_rows)


def extend(stack: nn.Module, x: torch.Tensor, positions: torch.Tensor, cache: tuple,
           slots: int | None = None) -> tuple[torch.Tensor, list]:
    """x [B, T, H]: T new rows per member from `positions` [B] on, over the first `slots` cache slots
    (all when None; slots before a member's position are valid); returns the last row's normed
    hidden [B, H] and each layer's new key rows [B, Hkv, D, T] and value rows [B, Hkv, T, D]."""
    t = x.shape[1]
    rows = positions.unsqueeze(1) + torch.arange(t).unsqueeze(0)  # [B, T]
    cos, sin = rope_tables(rows, stack.c.head_dim, stack.c.rope_theta)  # [B, T, D]
    if slots is not None:  # read only the slots in use
        cache = tuple(c[..., :slots] if i % 2 == 0 else c[:, :, :slots] for i, c in enumerate(cache))
    slots = cache[1].shape[2]
    valid = (torch.arange(slots).unsqueeze(0) < positions.unsqueeze(1)).view(-1, 1, 1, slots)
    new_rows = []
    for i, layer in enumerate(stack.layers):
        attn, k, v = layer.self_attn.extend(layer.input_layernorm(x), cos, sin, cache[2 * i], cache[2 * i + 1], valid)
        x = layer.finish(x, attn)
        new_rows += [k.transpose(2, 3), v]  # [B, Hkv, D, T], [B, Hkv, T, D]
    return stack.norm(x[:, -1]), new_rows


class CodePredictorPass(nn.Module):
    """One pass of the code predictor: T new rows (talker width, projected in the graph) over the
    predictor's KV cache, then residual group `group`'s code sampled from the last row with that
    group's head, and the code's embedding (talker width: the next pass's row, and a term of the
    frame's codec sum). The heads and the residual embeddings are stacked ([G-1, Hc, Vc] and
    [(G-1) x Vc, H]) and gathered by `group`, so one graph serves every group."""

    def __init__(self, predictor: nn.Module):
        super().__init__()
        self.predictor = predictor
        self.register_buffer("heads", torch.stack([h.weight.T for h in predictor.lm_head]).contiguous().detach())
        self.register_buffer("embeddings", torch.cat([e.weight for e in predictor.cp_embedding]).contiguous().detach())
        self.codebook = predictor.cfg.codebook_size

    def forward(self, inputs_embeds, positions, group, temperature, top_k, top_p, noise, *cache):
        # inputs_embeds [B, T, H]; positions [B]; group [1]; noise [B, Vc]
        x = self.predictor.small_to_mtp_projection(inputs_embeds)
        hidden, new_rows = extend(self.predictor.model, x, positions, cache)
        code = sample(hidden @ self.heads[group[0]], temperature, top_k, top_p, noise)
        embedding = nn.functional.embedding(code + group[0] * self.codebook, self.embeddings)
        return (code, embedding, *new_rows)


def predictor_cache(inputs, batch: int, slots: int) -> list[np.ndarray]:
    """A fresh code-predictor cache for `predict_frame`: zeros shaped as the pass graph's past_* inputs
    (`inputs`: an ONNX Runtime session's `get_inputs()`) for `batch` members and `slots` slots."""
    return [np.zeros([batch, i.shape[1], i.shape[2], slots] if i.name.startswith("past_keys")
                     else [batch, i.shape[1], slots, i.shape[3]], np.float32)
            for i in inputs if i.name.startswith("past_")]


def predict_frame(run, hidden: np.ndarray, code0: np.ndarray, codec_embedding: np.ndarray, groups: int,
                  cache: list[np.ndarray], sampling: dict[str, np.ndarray], noise: np.ndarray):
    """Groups 1..G-1 of a frame for members [B] through `run(feeds) -> (code, embedding, *new rows)`
    (a code-predictor pass graph), as the runtime drives it: [hidden, E(code 0)] at position 0 with
    group 0, then each group's embedding at position g + 1 with group g; the new K/V rows go into
    `cache` (past_keys_i [B, Hkv, D, G], past_values_i [B, Hkv, G, D], ...). noise [B, G-1, Vc].
    Returns codes [B, G-1] and the codec sum [B, H] (E(code 0) + every group's embedding, in order)."""
    b = hidden.shape[0]
    rows = np.stack([hidden, codec_embedding[code0]], axis=1).astype(np.float32)
    codec_sum = rows[:, 1].copy()
    codes = np.zeros((b, groups - 1), np.int64)
    for g in range(groups - 1):
        position = 0 if g == 0 else g + 1
        feeds = {"inputs_embeds": rows, "positions": np.full(b, position, np.int64), "group": np.array([g]),
                 **sampling, "noise": np.ascontiguousarray(noise[:, g])}
        for i in range(len(cache) // 2):
            feeds[f"past_keys_{i}"], feeds[f"past_values_{i}"] = cache[2 * i], cache[2 * i + 1]
        code, embedding, *new = run(feeds)
        t = rows.shape[1]
        for i in range(len(cache) // 2):
            cache[2 * i][..., position:position + t] = new[2 * i]
            cache[2 * i + 1][:, :, position:position + t] = new[2 * i + 1]
        codes[:, g] = code
        codec_sum += embedding
        rows = embedding[:, None].astype(np.float32)
    return codes, codec_sum


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
    """One graph for prefill and decode: batch B, new rows T, cache slots P and slots attended L all
    dynamic."""
    c = talker.cfg.talker
    b, t = 2, 3
    cache = []
    for _ in range(c.layers):
        cache += [torch.randn(b, c.kv_heads, c.head_dim, max_seq), torch.randn(b, c.kv_heads, max_seq, c.head_dim)]
    args = (torch.randn(b, t, c.hidden), torch.tensor([3, 7]), torch.zeros(max_seq - 3, dtype=torch.int64),
            *sampling_examples(b, talker.cfg.vocab, code0=True), *cache)
    inputs = ["inputs_embeds", "positions", "slots", *CODE0_INPUTS, *SAMPLING_INPUTS, *kv_names("past", c.layers)]
    outputs = ["hidden", "code0", *kv_names("new", c.layers)]
    batch = torch.export.Dim("B", min=1, max=1024)
    rows = torch.export.Dim("T", min=1, max=32768)
    slots = torch.export.Dim("P", min=1, max=32768)
    attended = torch.export.Dim("L", min=1, max=32768)
    past = tuple(({0: batch, 3: slots} if i % 2 == 0 else {0: batch, 2: slots}) for i in range(len(cache)))
    dynamic = ({0: batch, 1: rows}, {0: batch}, {0: attended}) + ({0: batch},) * 7 + (past,)
    return export_graph(TalkerStep(talker), args, path, inputs, outputs, dynamic)


def export_predictor(predictor: nn.Module, path: Path) -> dict:
    """One pass over the predictor's cache: batch B, new rows T and cache slots P all dynamic."""
    cfg = predictor.cfg
    c = cfg.predictor
    b, t, slots = 2, 2, cfg.code_groups
    cache = []
    for _ in range(c.layers):
        cache += [torch.randn(b, c.kv_heads, c.head_dim, slots), torch.randn(b, c.kv_heads, slots, c.head_dim)]
    args = (torch.randn(b, t, cfg.talker.hidden), torch.tensor([0, 3]), torch.tensor([1]),
            torch.full((b,), 0.9), torch.full((b,), 50, dtype=torch.long), torch.ones(b),
            torch.rand(b, cfg.codebook_size), *cache)
    inputs = ["inputs_embeds", "positions", "group", *SAMPLING_INPUTS, *kv_names("past", c.layers)]
    outputs = ["code", "embedding", *kv_names("new", c.layers)]
    batch = torch.export.Dim("B", min=1, max=1024)
    rows = torch.export.Dim("T", min=1, max=1024)
    slots_dim = torch.export.Dim("P", min=1, max=1024)
    past = tuple(({0: batch, 3: slots_dim} if i % 2 == 0 else {0: batch, 2: slots_dim}) for i in range(len(cache)))
    dynamic = ({0: batch, 1: rows}, {0: batch}, None, {0: batch}, {0: batch}, {0: batch}, {0: batch}, past)
    return export_graph(CodePredictorPass(predictor), args, path, inputs, outputs, dynamic)
