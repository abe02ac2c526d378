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
