"""Sampling inside the graphs, as HF's logits processors do it (checked against them in the tests).

Code 0: repetition penalty over earlier code-0 tokens, then the specials suppressed; then, for every
sampled token, temperature -> top-k -> top-p -> Gumbel-max with uniform noise the host fills.

Top-k and top-p work on a static window of the WINDOW best candidates (TopK), and the probability
mass above each candidate is a matmul with a triangular matrix, not a CumSum: TensorRT before 10.8
turns CumSum into a loop over the axis (3072 steps per talker step). The result is HF's exactly
when top-k is on and at most WINDOW, and when neither top-k nor top-p filters (the whole vocabulary
is sampled); with top-k off and top-p < 1 it is HF's unless the nucleus holds more than WINDOW
tokens (then it is cut at WINDOW); a top-k above WINDOW acts as WINDOW.

A constant branch of `torch.where` is a scalar, not a `full_like`: that exports as Shape + Expand,
run at every step.
"""

from __future__ import annotations

import numpy as np
import torch

NEG_INF = float("-inf")
SPECIALS_PER_VOCAB = 1024  # the reference suppresses [vocab - 1024, vocab) except eos
WINDOW = 256
"""Candidates top-k and top-p choose from (the default top-k is 50)."""
STRICTLY_UPPER = torch.from_numpy(np.triu(np.ones((WINDOW, WINDOW), dtype=np.float32), k=1))
"""[W, W], 1 above the diagonal: probs @ it = the mass above each candidate. Made outside any trace,
so a graph holds it as a constant (no Trilu at run time)."""


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
    return torch.where(suppressed.unsqueeze(0) | eos_blocked, NEG_INF, logits)


def filtered(logits, temperature, top_k, top_p):
    """The temperature-scaled logits with every token that top-k or top-p removes at -inf, per row
    (a greedy row is scaled by 1). logits [..., V]; temperature/top_k/top_p broadcast over the
    leading dims. HF's top-p removes a token when the ascending cumulative probability up to it is
    <= 1 - top_p, i.e. when the probability mass strictly above it (in descending order) is >= top_p.
    """
    vocab = logits.shape[-1]
    w = min(WINDOW, vocab)
    greedy = temperature <= 0
    t = torch.where(greedy, 1.0, temperature).unsqueeze(-1)
    scaled = logits / t
    best, _ = torch.topk(scaled, w, dim=-1)  # [..., W], descending
    k = torch.where((top_k <= 0) | (top_k > w), w, top_k)
    in_top_k = torch.arange(w) < k.unsqueeze(-1)
    window = torch.where(in_top_k, best, NEG_INF)
    # probabilities as HF's top-p sees them: over the top-k survivors, or the whole vocabulary when top-k is off
    top_k_off = ((top_k <= 0) | (top_k >= vocab)).unsqueeze(-1)
    norm = torch.where(top_k_off, torch.logsumexp(scaled, -1, keepdim=True), torch.logsumexp(window, -1, keepdim=True))
    probs = torch.exp(window - norm)
    mass_above = torch.matmul(probs, STRICTLY_UPPER[:w, :w])  # exclusive prefix sums
    keep = in_top_k & ((mass_above < top_p.unsqueeze(-1)) | (top_p.unsqueeze(-1) >= 1.0))
    kept = keep.sum(-1, keepdim=True).clamp(min=1)  # keep is a prefix: its length picks the threshold
    threshold = torch.gather(window, -1, kept - 1)
    unfiltered = top_k_off & (top_p.unsqueeze(-1) >= 1.0)
    threshold = torch.where(unfiltered, NEG_INF, threshold)
    return torch.where(scaled < threshold, NEG_INF, scaled)


def sample(logits, temperature, top_k, top_p, noise):
    """Temperature -> top-k -> top-p -> Gumbel-max, per row; temperature <= 0 is greedy (argmax).

    logits [..., V]; temperature/top_k/top_p broadcast over the leading dims; noise [..., V] uniform.
    """
    gumbel = -torch.log(-torch.log(noise))
    greedy = (temperature <= 0).unsqueeze(-1)
    score = torch.where(greedy, logits, filtered(logits, temperature, top_k, top_p) + gumbel)
    return torch.argmax(score, dim=-1)


def probabilities(logits, temperature, top_k, top_p):
    """The distribution `sample` draws from: the softmax of `filtered`; one-hot at the argmax where
    greedy. logits [..., V] -> [..., V]."""
    soft = torch.softmax(filtered(logits, temperature, top_k, top_p), dim=-1)
    best = torch.argmax(logits, dim=-1, keepdim=True)
    onehot = (torch.arange(logits.shape[-1]) == best).to(logits.dtype)
    return torch.where((temperature <= 0).unsqueeze(-1), onehot, soft)
