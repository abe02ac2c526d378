"""Sampling inside the graphs, as HF's logits processors do it (checked against them in the tests).

Code 0: repetition penalty over earlier code-0 tokens, then the specials suppressed; then, for every
sampled token, temperature -> top-k -> top-p -> Gumbel-max with uniform noise the host fills.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
SPECIALS_PER_VOCAB = 1024  # the reference suppresses [vocab - 1024, vocab) except eos


def process_code0(logits, seen, repetition_penalty, allow_eos, eos: int):
    """Repetition penalty over earlier code-0 tokens, then suppress specials (and eos until allowed).

    logits [B, V]; seen [B, V] (1.0 where the token was generated before); allow_eos [B] bool.
    """
    vocab = logits.shape[-1]
    penalty = repetition_penalty.unsqueeze(-1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    logits = torch.where(seen > 0, penalized, logits)
    ids = torch.arange(vocab)
    suppressed = (ids >= vocab - SPECIALS_PER_VOCAB) & (ids != eos)  # [V]
    eos_blocked = (ids == eos).unsqueeze(0) & ~allow_eos.unsqueeze(-1)  # [B, V]
    return torch.where(suppressed.unsqueeze(0) | eos_blocked, torch.full_like(logits, NEG_INF), logits)


def sample(logits, temperature, top_k, top_p, noise):
    """Temperature -> top-k -> top-p -> Gumbel-max, per row; temperature <= 0 is greedy (argmax).

    logits [..., V]; temperature/top_k/top_p broadcast over the leading dims; noise [..., V] uniform.
    HF's top-p removes a token when the ascending cumulative probability up to it is <= 1 - top_p,
    i.e. when the probability mass strictly above it (in descending order) is >= top_p.
    """
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    scaled = logits / t
    ordered, _ = torch.sort(scaled, dim=-1, descending=True)
    k = torch.where((top_k <= 0) | (top_k > vocab), torch.full_like(top_k, vocab), top_k)
    in_top_k = torch.arange(vocab) < k.unsqueeze(-1)
    ordered = torch.where(in_top_k, ordered, torch.full_like(ordered, NEG_INF))
    probs = torch.softmax(ordered, dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs
    keep = in_top_k & ((mass_above < top_p.unsqueeze(-1)) | (top_p.unsqueeze(-1) >= 1.0))
    kept = keep.sum(-1, keepdim=True).clamp(min=1)  # keep is a prefix: its length picks the threshold
    threshold = torch.gather(ordered, -1, kept - 1)
    filtered = torch.where(scaled < threshold, torch.full_like(scaled, NEG_INF), scaled)
    gumbel = -torch.log(-torch.log(noise))
    score = torch.where(greedy.unsqueeze(-1), logits, filtered + gumbel)
    return torch.argmax(score, dim=-1)
