"""The talker and code-predictor graphs every family exports, and their export.

`TalkerStep` is the one talker graph: new rows over the runtime's KV cache, code 0 sampled.
`CodePredictorPass` is the one code-predictor graph: new rows over the predictor's own KV cache, the
last rows' codes drawn with their groups' heads and, when drafts are given, checked by the
speculative rule; `CodePredictorDraft` proposes the next groups' codes from one verified hidden
(the later heads applied to it). Without speculation a frame is G-1 passes (`predict_frame` drives
them as the runtime does). Each layer weight is read by one product of the graph and stored once
(a quantized weight must be: engines/quantize.py); the heads and the residual embeddings are host
tables (engines.qwen3_tts.model.predictor_table_sources), bound or looked up by the runtime. A
family's talker module supplies `model` (an `engines.layers.Stack`), `codec_head`, `eos` (the code 0
that ends an utterance) and `cfg` (`talker` stack config, `vocab`); its code predictor's weights are
`engines.qwen3_tts.model.CodePredictorFrame`. Built with fake tensors, the modules export from their
shapes and `weights` (engines.weights) makes each tensor as the graph is written.
docs/artifact.md has the graphs' contracts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from edged.request import MAX_VERIFY_WINDOW as MAX_WINDOW
from engines.layers import rope_tables
from engines.onnx import export_graph
from engines.sampling import probabilities, process_code0, sample
from engines.weights import Weights


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
           slots: int | None = None, last: int | None = None) -> tuple[torch.Tensor, list]:
    """x [B, T, H]: T new rows per member from `positions` [B] on, over the first `slots` cache slots
    (all when None; slots before a member's position are valid); returns the last row's normed
    hidden [B, H] (with `last`: the last `last` rows', [B, last, H]) and each layer's new key rows
    [B, Hkv, D, T] and value rows [B, Hkv, T, D]."""
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
    return stack.norm(x[:, -1] if last is None else x[:, t - last:]), new_rows


INCLUSIVE_UPPER = torch.from_numpy(np.triu(np.ones((MAX_WINDOW, MAX_WINDOW), dtype=np.float32)))
"""[W, W], 1 on and above the diagonal: rejected @ it counts the rejections up to each row."""


def accepts(p_draft, q_draft, accept_noise):
    """The speculative rule's test: a draft d drawn from q is kept with probability min(1, p(d) / q(d)),
    i.e. when uniform noise * q(d) < p(d) (a column without a draft has q = 0 and keeps nothing)."""
    return (accept_noise * q_draft < p_draft) & (q_draft > 0)


def residual_of(p, q):
    """What a rejected row draws from: max(p - q, 0), unnormalized (Gumbel-max needs no normalizing).
    With the test above, a row's code then has exactly the distribution p."""
    return torch.clamp(p - q, min=0.0)


class CodePredictorPass(nn.Module):
    """One pass of the code predictor: T new rows (talker width, projected in the graph) over the
    predictor's KV cache; the last V rows are verified, row T-V+i with head i of `heads` (the
    residual groups' heads are a bound input, [V, Hc, Vc], so a pass reads only the heads it uses
    and no copy is made of them). Row i checks draft i by the speculative rule: with p the
    distribution `sample` draws from (one-hot where greedy) and q the draft's, draft d is accepted
    when accept_noise * q(d) < p(d); otherwise the row's code is drawn from norm(max(p - q, 0)).
    The last column's q is all zero, so its code is always drawn from p: with V = 1 a pass is the
    plain autoregressive step. `accepted` counts each member's leading accepted drafts; `hidden` is
    the normed hidden of the verified rows (the next drafts come from one of them)."""

    def __init__(self, predictor: nn.Module):
        super().__init__()
        self.predictor = predictor

    def forward(self, inputs_embeds, positions, heads, drafts, draft_probs, temperature, top_k, top_p,
                accept_noise, noise, *cache):
        # inputs_embeds [B, T, H]; positions [B]; heads [V, Hc, Vc]; drafts [B, V]; draft_probs [B, V, Vc];
        # accept_noise [B, V]; noise [B, V, Vc]
        verified = drafts.shape[1]
        x = self.predictor.small_to_mtp_projection(inputs_embeds)
        hidden, new_rows = extend(self.predictor.model, x, positions, cache, last=verified)  # [B, V, Hc]
        logits = torch.matmul(hidden.transpose(0, 1), heads).transpose(0, 1)  # [B, V, Vc]
        settings = (temperature.unsqueeze(-1), top_k.unsqueeze(-1), top_p.unsqueeze(-1))
        p = probabilities(logits, *settings)
        p_draft = torch.gather(p, -1, drafts.unsqueeze(-1)).squeeze(-1)
        q_draft = torch.gather(draft_probs, -1, drafts.unsqueeze(-1)).squeeze(-1)
        accept = accepts(p_draft, q_draft, accept_noise)
        residual = residual_of(p, draft_probs)
        gumbel = -torch.log(-torch.log(noise))
        greedy = (temperature <= 0).view(-1, 1, 1)
        drawn = torch.argmax(torch.where(greedy, residual, torch.log(residual) + gumbel), dim=-1)
        codes = torch.where(accept, drafts, drawn)
        rejections = torch.matmul((~accept).to(torch.float32), INCLUSIVE_UPPER[:verified, :verified])
        accepted = (rejections == 0).to(torch.int64).sum(-1)
        return (codes, accepted, hidden, *new_rows)


class CodePredictorDraft(nn.Module):
    """Drafts for the next D groups from one verified hidden each: heads [D, Hc, Vc] (bound, the
    groups after the last committed one) applied to it, each draft sampled as `sample` does, and its
    distribution q (one-hot where greedy). No weights of its own: one matmul per drafted group."""

    def forward(self, hidden, heads, temperature, top_k, top_p, noise):
        # hidden [B, Hc]; heads [D, Hc, Vc]; noise [B, D, Vc]
        logits = torch.matmul(hidden.unsqueeze(0), heads).transpose(0, 1)  # [B, D, Vc]
        settings = (temperature.unsqueeze(-1), top_k.unsqueeze(-1), top_p.unsqueeze(-1))
        return sample(logits, *settings, noise), probabilities(logits, *settings)


def predictor_cache(inputs, batch: int, slots: int) -> list[np.ndarray]:
    """A fresh code-predictor cache for `predict_frame`: zeros shaped as the pass graph's past_* inputs
    (`inputs`: an ONNX Runtime session's `get_inputs()`) for `batch` members and `slots` slots, in
    their type (an fp16 network's cache is fp16: engines/fp16.py)."""
    return [np.zeros([batch, i.shape[1], i.shape[2], slots] if i.name.startswith("past_keys")
                     else [batch, i.shape[1], slots, i.shape[3]], np.float16 if i.type == "tensor(float16)" else np.float32)
            for i in inputs if i.name.startswith("past_")]


def predict_frame(run, hidden: np.ndarray, code0: np.ndarray, tables: dict[str, np.ndarray], groups: int,
                  cache: list[np.ndarray], sampling: dict[str, np.ndarray], noise: np.ndarray):
    """Groups 1..G-1 of a frame for members [B] through `run(feeds) -> (codes, accepted, hidden, *new
    rows)` (a code-predictor pass graph), autoregressively as the runtime drives it without
    speculation: [hidden, E(code 0)] at position 0 with head 0, then each group's embedding at
    position g + 1 with head g; the new K/V rows go into `cache` (past_keys_i [B, Hkv, D, G],
    past_values_i [B, Hkv, G, D], ...). `tables`: codec_embedding (code 0's), cp_heads and
    cp_codec_embedding. noise [B, G-1, Vc]. Returns codes [B, G-1] and the codec sum [B, H]
    (E(code 0) + every group's embedding, in order)."""
    b, vc = hidden.shape[0], tables["cp_heads"].shape[-1]
    rows = np.stack([hidden, tables["codec_embedding"][code0]], axis=1).astype(np.float32)
    codec_sum = rows[:, 1].copy()
    codes = np.zeros((b, groups - 1), np.int64)
    no_draft = {"drafts": np.zeros((b, 1), np.int64), "draft_probs": np.zeros((b, 1, vc), np.float32),
                "accept_noise": np.zeros((b, 1), np.float32)}
    for g in range(groups - 1):
        position = 0 if g == 0 else g + 1
        feeds = {"inputs_embeds": rows, "positions": np.full(b, position, np.int64),
                 "heads": tables["cp_heads"][g:g + 1], **no_draft, **sampling,
                 "noise": np.ascontiguousarray(noise[:, g:g + 1])}
        for i in range(len(cache) // 2):
            feeds[f"past_keys_{i}"], feeds[f"past_values_{i}"] = cache[2 * i], cache[2 * i + 1]
        code, _, _, *new = run(feeds)
        t = rows.shape[1]
        for i in range(len(cache) // 2):
            cache[2 * i][..., position:position + t] = new[2 * i]
            cache[2 * i + 1][:, :, position:position + t] = new[2 * i + 1]
        codes[:, g] = code[:, 0]
        embedding = tables["cp_codec_embedding"][g][code[:, 0]]
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


def export_talker(talker: nn.Module, path: Path, max_seq: int, weights: Weights | None = None) -> dict:
    """One graph for prefill and decode: batch B, new rows T, cache slots P and slots attended L all
    dynamic. `weights`: where a fake talker's tensors come from (engines.weights)."""
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
    return export_graph(TalkerStep(talker), args, path, inputs, outputs, dynamic, _made(weights))


def export_predictor(predictor: nn.Module, path: Path, weights: Weights | None = None) -> dict:
    """One pass over the predictor's cache: batch B, new rows T, verified rows V and cache slots P all
    dynamic. `weights`: where a fake predictor's tensors come from."""
    cfg = predictor.cfg
    c = cfg.predictor
    b, t, v, slots = 2, 3, 2, cfg.code_groups
    cache = []
    for _ in range(c.layers):
        cache += [torch.randn(b, c.kv_heads, c.head_dim, slots), torch.randn(b, c.kv_heads, slots, c.head_dim)]
    heads = torch.randn(v, c.hidden, cfg.codebook_size)
    args = (torch.randn(b, t, cfg.talker.hidden), torch.tensor([0, 3]), heads, torch.tensor([[1, 2], [3, 4]]),
            torch.rand(b, v, cfg.codebook_size), torch.full((b,), 0.9), torch.full((b,), 50, dtype=torch.long),
            torch.ones(b), torch.rand(b, v), torch.rand(b, v, cfg.codebook_size), *cache)
    inputs = ["inputs_embeds", "positions", "heads", "drafts", "draft_probs", "temperature", "top_k", "top_p",
              "accept_noise", "noise", *kv_names("past", c.layers)]
    outputs = ["codes", "accepted", "hidden", *kv_names("new", c.layers)]
    batch = torch.export.Dim("B", min=1, max=1024)
    rows = torch.export.Dim("T", min=1, max=1024)
    verified = torch.export.Dim("V", min=1, max=MAX_WINDOW)
    slots_dim = torch.export.Dim("P", min=1, max=1024)
    past = tuple(({0: batch, 3: slots_dim} if i % 2 == 0 else {0: batch, 2: slots_dim}) for i in range(len(cache)))
    dynamic = ({0: batch, 1: rows}, {0: batch}, {0: verified}, {0: batch, 1: verified}, {0: batch, 1: verified},
               {0: batch}, {0: batch}, {0: batch}, {0: batch, 1: verified}, {0: batch, 1: verified}, past)
    return export_graph(CodePredictorPass(predictor), args, path, inputs, outputs, dynamic,
                        _made(weights))


def export_draft(predictor: nn.Module, path: Path) -> dict:
    """The draft graph: batch B and drafted groups D dynamic."""
    cfg = predictor.cfg
    b, d = 2, 3
    heads = torch.randn(d, cfg.predictor.hidden, cfg.codebook_size)
    args = (torch.randn(b, cfg.predictor.hidden), heads, torch.full((b,), 0.9), torch.full((b,), 50, dtype=torch.long),
            torch.ones(b), torch.rand(b, d, cfg.codebook_size))
    batch = torch.export.Dim("B", min=1, max=1024)
    drafted = torch.export.Dim("D", min=1, max=MAX_WINDOW - 1)
    dynamic = ({0: batch}, {0: drafted}, {0: batch}, {0: batch}, {0: batch}, {0: batch, 1: drafted})
    return export_graph(CodePredictorDraft(), args, path, ["hidden", "heads", *SAMPLING_INPUTS],
                        ["drafts", "draft_probs"], dynamic)



def _made(weights: Weights | None):
    """The graph's weight names are the Weights' names (the graph modules wrap `talker`, `predictor`)."""
    return None if weights is None else weights.tensor
