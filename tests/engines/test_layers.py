"""engines.layers against transformers' Qwen3 where the exported form departs from the reference's."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

from engines.layers import apply_rope, rope_tables


@pytest.mark.parametrize("head_dim, theta", [(128, 1e6), (64, 1e4)])
def test_rotary_is_the_references_bit_for_bit(head_dim: int, theta: float) -> None:
    """The signed sin table and the half swap give transformers' rotate_half form exactly, in the
    layout the attention rotates in ([B, T, H, D], before the heads move) and in the reference's."""
    torch.manual_seed(0)
    positions = torch.tensor([[0, 1, 2, 3, 4], [57, 58, 59, 60, 61]])
    q, k = torch.randn(2, 5, 4, head_dim), torch.randn(2, 5, 2, head_dim)  # [B, T, H, D]
    config = Qwen3Config(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=head_dim, rope_theta=theta)
    cos_ref, sin_ref = Qwen3RotaryEmbedding(config)(q, positions)  # [B, T, D]
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos_ref, sin_ref)  # [B, H, T, D]

    cos, signed_sin = rope_tables(positions, head_dim, theta)
    assert torch.equal(cos, cos_ref)
    heads_last = cos.unsqueeze(-2), signed_sin.unsqueeze(-2)
    assert torch.equal(apply_rope(q, *heads_last).transpose(1, 2), q_ref)
    assert torch.equal(apply_rope(k, *heads_last).transpose(1, 2), k_ref)
    heads_first = cos.unsqueeze(1), signed_sin.unsqueeze(1)
    assert torch.equal(apply_rope(q.transpose(1, 2), *heads_first), q_ref)
