"""The in-graph sampler (engines.sampling.sample / process_code0) against HF's logits processors."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engines.sampling import process_code0, sample

VOCAB = 40


def _hf_probs(logits, temperature, top_k, top_p):
    scores = logits.unsqueeze(0)
    ids = torch.zeros(1, 0, dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return torch.softmax(scores, dim=-1)[0]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 10, 0.6)])
def test_sampling_distribution_matches_hf(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(VOCAB, generator=gen) * 2
    draws = 40000
    noise = torch.rand(draws, VOCAB, generator=gen)
    picked = sample(logits.expand(draws, VOCAB), torch.full((draws,), temperature),
                    torch.full((draws,), top_k, dtype=torch.long), torch.full((draws,), top_p), noise)
    empirical = torch.bincount(picked, minlength=VOCAB).float() / draws
    expected = _hf_probs(logits, temperature, top_k, top_p)
    assert set(torch.nonzero(empirical).flatten().tolist()) <= set(torch.nonzero(expected).flatten().tolist())
    assert (empirical - expected).abs().max() < 0.012


def test_greedy_is_argmax_whatever_the_noise():
    logits = torch.randn(8, VOCAB)
    got = sample(logits, torch.zeros(8), torch.full((8,), 3, dtype=torch.long), torch.full((8,), 0.5), torch.rand(8, VOCAB))
    assert torch.equal(got, logits.argmax(-1))


def test_code0_processing_matches_hf_penalty_and_suppression():
    vocab, eos = 3072, 2150
    logits = torch.randn(2, vocab)
    seen_ids = torch.tensor([[5, 77, 1000], [9, 9, 2047]])
    seen = torch.zeros(2, vocab).scatter_(1, seen_ids, 1.0)
    got = process_code0(logits, seen, torch.tensor([1.3, 1.3]), torch.tensor([True, False]), eos)
    want = RepetitionPenaltyLogitsProcessor(1.3)(seen_ids, logits.clone())
    want[:, 2048:] = float("-inf")
    want[0, eos] = RepetitionPenaltyLogitsProcessor(1.3)(seen_ids, logits.clone())[0, eos]
    assert torch.equal(got, want)


def _sample_by_sorting(logits, temperature, top_k, top_p, noise):
    """The sampler as it was before the window: a full sort and a CumSum (HF's semantics, stated plainly)."""
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    scaled = logits / t
    ordered, _ = torch.sort(scaled, dim=-1, descending=True)
    k = torch.where((top_k <= 0) | (top_k > vocab), torch.full_like(top_k, vocab), top_k)
    in_top_k = torch.arange(vocab) < k.unsqueeze(-1)
    ordered = torch.where(in_top_k, ordered, torch.full_like(ordered, float("-inf")))
    probs = torch.softmax(ordered, dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs
    keep = in_top_k & ((mass_above < top_p.unsqueeze(-1)) | (top_p.unsqueeze(-1) >= 1.0))
    threshold = torch.gather(ordered, -1, keep.sum(-1, keepdim=True).clamp(min=1) - 1)
    filtered = torch.where(scaled < threshold, torch.full_like(scaled, float("-inf")), scaled)
    score = torch.where(greedy.unsqueeze(-1), logits, filtered - torch.log(-torch.log(noise)))
    return torch.argmax(score, dim=-1)


@pytest.mark.parametrize("vocab", [2048, 3072])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.9, 50, 1.0), (0.9, 50, 0.8), (1.0, 0, 1.0), (0.7, 0, 0.6),
                                                     (1.2, 256, 0.95), (0.0, 50, 1.0)])
def test_the_windowed_sampler_picks_what_sorting_the_vocabulary_picks(vocab, temperature, top_k, top_p):
    """The talker's and the code predictor's vocabulary sizes, the defaults and the edge settings: the
    TopK window with a triangular-matmul prefix sum picks exactly the token a full sort + CumSum picks."""
    gen = torch.Generator().manual_seed(vocab + top_k)
    rows = 2000
    logits = torch.randn(rows, vocab, generator=gen) * 3
    noise = torch.rand(rows, vocab, generator=gen)
    args = (torch.full((rows,), temperature), torch.full((rows,), top_k, dtype=torch.long), torch.full((rows,), top_p))
    assert torch.equal(sample(logits, *args, noise), _sample_by_sorting(logits, *args, noise))


def test_the_exported_sampling_graphs_have_no_cumsum(builtin_artifact):
    import onnx

    from edged.artifact import load_artifact

    artifact = load_artifact(builtin_artifact)
    for role in ("talker", "code_predictor"):
        ops = {n.op_type for n in onnx.load(str(artifact.file(role))).graph.node}
        assert "CumSum" not in ops and "TopK" in ops, role
