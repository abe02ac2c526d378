"""The Qwen3 decoder layers the talker families share, written for export.

RMSNorm, rotary embeddings, grouped-query attention (whole causal prompts, and new rows over a
runtime-owned cache whose keys are stored transposed), the SwiGLU MLP or a mixture of experts, and a
stack of blocks whose weights are named as in the checkpoints (`layers.*`, `norm`). Text-only inputs give three equal
M-RoPE position rows, so the interleaved multimodal RoPE of the references is plain 1-D RoPE here.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.config import MoEConfig, StackConfig

NEG_INF = float("-inf")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt, not x * rsqrt: ONNX Runtime fuses this form into one SimplifiedLayerNormalization
        return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, and sin with its first half negated, for float positions [...] -> [..., D], computed as HF
    computes them (float32): apply_rope's rotation is then a permutation, one Gather a tensor."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    sin = freqs.sin()
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-sin, sin), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin, bit for bit: rotate_half(x) = (-x2, x1) and
    (-a) * b = a * (-b) exactly, so the halves are swapped and the sign rides on the table."""
    half = x.shape[-1] // 2
    swap = torch.cat((torch.arange(half, 2 * half), torch.arange(half)))
    return x * cos + torch.index_select(x, -1, swap) * signed_sin


class Attention(nn.Module):
    def __init__(self, c: StackConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, H] -> q [B, Hq, T, D], k [B, Hkv, T, D], v [B, Hkv, T, D], rotated."""
        b, t, _ = x.shape
        c = self.c
        q = self.q_norm(self.q_proj(x).view(b, t, c.heads, c.head_dim))
        k = self.k_norm(self.k_proj(x).view(b, t, c.kv_heads, c.head_dim))
        v = self.v_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # rotated before the heads move: no Transpose around the Gather
        return apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2), v

    def causal(self, x, cos, sin, past_k=None, past_v=None):
        """Full causal attention over (optional past) + x. Returns out [B,T,H], k, v of x's rows."""
        q, k, v = self.project(x, cos, sin)
        keys = k if past_k is None else torch.cat((past_k, k), dim=2)
        values = v if past_v is None else torch.cat((past_v, v), dim=2)
        rep = self.c.heads // self.c.kv_heads
        keys_r = keys.repeat_interleave(rep, dim=1)
        values_r = values.repeat_interleave(rep, dim=1)
        t, s = q.shape[2], keys.shape[2]
        scores = torch.matmul(q, keys_r.transpose(2, 3)) * self.c.head_dim**-0.5  # [B, Hq, T, S]
        row = torch.arange(t).unsqueeze(1) + (s - t)
        col = torch.arange(s).unsqueeze(0)
        scores = scores.masked_fill(col > row, NEG_INF)
        out = torch.matmul(torch.softmax(scores, dim=-1), values_r)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], t, -1)), k, v

    def extend(self, x, cos, sin, past_kt, past_v, valid):
        """T new rows per batch member over a cache (T = 1: a decode step; T = the prompt: a prefill).

        x [B, T, H]; past_kt [B, Hkv, D, P] (transposed keys); past_v [B, Hkv, P, D];
        valid [B, 1, 1, P] bool (cache slots before the member's position). The new rows attend to
        the valid cache slots and causally to each other. Grouped-query heads are folded into the
        query rows (row r*T + t is head r of the group, new row t), so the cache is read once,
        never repeated or transposed.
        """
        c = self.c
        b, t = x.shape[0], x.shape[1]
        rep = c.heads // c.kv_heads
        q, k, v = self.project(x, cos, sin)  # q [B, Hq, T, D], k/v [B, Hkv, T, D]
        scale = c.head_dim**-0.5
        q = q.reshape(b, c.kv_heads, rep * t, c.head_dim)
        past_scores = torch.matmul(q, past_kt) * scale  # [B, Hkv, rep*T, P]
        past_scores = torch.where(valid, past_scores, NEG_INF)  # a scalar: no Shape + Expand
        new_scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, Hkv, rep*T, T]
        row = torch.arange(t).repeat(rep)  # the new row each query row is
        future = torch.arange(t).unsqueeze(0) > row.unsqueeze(1)  # [rep*T, T]
        new_scores = new_scores.masked_fill(future, NEG_INF)
        weights = torch.softmax(torch.cat((past_scores, new_scores), dim=-1), dim=-1)
        p = past_scores.shape[-1]
        out = torch.matmul(weights[..., :p], past_v) + torch.matmul(weights[..., p:], v)  # [B, Hkv, rep*T, D]
        out = out.reshape(b, c.kv_heads, rep, t, c.head_dim).permute(0, 3, 1, 2, 4)  # [B, T, Hkv, rep, D]
        return self.o_proj(out.reshape(b, t, c.heads * c.head_dim)), k, v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Router softmax over all experts, the top-k kept (renormalized when `norm_topk_prob`), plus the
    shared expert scaled by a sigmoid gate (`gate`, `shared_expert.*`, `shared_expert_gate` as in the
    checkpoints; the experts stacked: `experts_gate` and `experts_up` [E, H, I], `experts_down`
    [E, I, H], made from the checkpoint's `experts.{e}.*_proj` by engines.weights).

    Written for export so that a step reads only the experts its rows use: the routing weights are
    zero outside each row's top k (a mask at the k-th largest probability); the U = min(E, rows x k)
    experts with the largest weight over the rows (every expert any row chose, and zero-weight ones
    when rows share experts) are gathered from the stacked weights and run as one batched MatMul
    each for gate, up and down. A decode step of one row reads k of E experts; a long prefill, all of
    them. The graph is TopK (its K from the row count), Gather (axis 0 of each stack, so a smaller
    form of the stacks can be gathered before it is dequantized: engines/experts.py), MatMul and
    elementwise ops."""

    def __init__(self, c: StackConfig, m: MoEConfig):
        super().__init__()
        self.m = m
        self.gate = nn.Linear(c.hidden, m.experts, bias=False)
        self.experts_gate = nn.Parameter(torch.empty(m.experts, c.hidden, m.expert_width))
        self.experts_up = nn.Parameter(torch.empty(m.experts, c.hidden, m.expert_width))
        self.experts_down = nn.Parameter(torch.empty(m.experts, m.expert_width, c.hidden))
        self.shared_expert = MLP(c.hidden, m.shared_width)
        self.shared_expert_gate = nn.Linear(c.hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [..., E]
        kth = torch.topk(probs, self.m.top_k, dim=-1).values[..., -1:]
        weights = torch.where(probs >= kth, probs, 0.0)
        if self.m.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        rows = x.reshape(-1, x.shape[-1])  # [N, H]
        w = weights.reshape(-1, self.m.experts)  # [N, E]
        used = torch.topk(w.amax(dim=0), torch.sym_min(self.m.experts, rows.shape[0] * self.m.top_k)).indices
        gate, up, down = (torch.index_select(e, 0, used) for e in (self.experts_gate, self.experts_up, self.experts_down))
        act = nn.functional.silu(rows @ gate) * (rows @ up)  # [U, N, I]
        act = act * w[:, used].T.unsqueeze(-1)
        out = (act @ down).sum(dim=0).reshape(x.shape)  # [U, N, H] -> [..., H]
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Block(nn.Module):
    def __init__(self, c: StackConfig, moe: MoEConfig | None = None):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c.hidden, c.intermediate) if moe is None else MoE(c, moe)
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Stack(nn.Module):
    """Layers + final norm; weights named as in the checkpoint under `<prefix>.layers.*`."""

    def __init__(self, c: StackConfig, moe: MoEConfig | None = None):
        super().__init__()
        self.c = c
        self.layers = nn.ModuleList(Block(c, moe) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.rms_eps)

    def causal(self, x, positions, past=None):
        """x [B, T, H] at positions [T]; past: list of (k, v) per layer or None. Returns h, [(k, v)]."""
        cos, sin = rope_tables(positions, self.c.head_dim, self.c.rope_theta)
        rows = []
        for i, layer in enumerate(self.layers):
            pk, pv = past[i] if past is not None else (None, None)
            attn, k, v = layer.self_attn.causal(layer.input_layernorm(x), cos, sin, pk, pv)
            x = layer.finish(x, attn)
            rows.append((k, v))
        return self.norm(x), rows
