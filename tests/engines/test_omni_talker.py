"""Qwen3-Omni's MoE talker, as exported (engines.qwen3_omni + the shared talker graph module), equals
transformers' own talker on tiny random checkpoints of three shapes (experts, top-k, layers, code
groups): a prefill, then decode steps over the cache the runtime would hold."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engines.qwen3_omni.model import load_qwen3_omni
from engines.qwen3_omni.tiny import VARIANTS, build_model
from engines.talker import TalkerStep


def run_ours(step: TalkerStep, rows: torch.Tensor, positions: int, cache: list[torch.Tensor]):
    """One graph call: `rows` [1, T, H] at `positions`, over `cache`; greedy sampling inputs."""
    vocab = step.talker.codec_head.out_features
    hidden, code0, *new = step(rows, torch.tensor([positions]), torch.zeros(1, vocab), torch.ones(1),
                               torch.ones(1, dtype=torch.bool), torch.zeros(1), torch.zeros(1, dtype=torch.long),
                               torch.ones(1), torch.rand(1, vocab), *cache)
    return hidden, code0, new


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_the_moe_talker_equals_the_library(tmp_path, variant):
    model = build_model(seed=variant, variant=variant)
    model.save_pretrained(tmp_path)
    cfg, talker, _, _ = load_qwen3_omni(tmp_path)
    step = TalkerStep(talker).eval()
    reference = model.talker
    c = cfg.talker
    torch.manual_seed(7)
    prompt = torch.randn(1, 9, c.hidden)
    steps = [torch.randn(1, 1, c.hidden) for _ in range(3)]
    slots = 16
    keys = [torch.zeros(1, c.kv_heads, c.head_dim, slots) for _ in range(c.layers)]
    values = [torch.zeros(1, c.kv_heads, slots, c.head_dim) for _ in range(c.layers)]
    with torch.no_grad():
        out = reference.model(inputs_embeds=prompt, use_cache=True)
        past = out.past_key_values
        want = [out.last_hidden_state[:, -1]]
        for x in steps:
            out = reference.model(inputs_embeds=x, past_key_values=past, use_cache=True)
            want.append(out.last_hidden_state[:, -1])
        none = [t for _ in range(c.layers) for t in (torch.zeros(1, c.kv_heads, c.head_dim, 1),
                                                     torch.zeros(1, c.kv_heads, 1, c.head_dim))]
        hidden, _, new = run_ours(step, prompt, 0, none)
        got = [hidden]
        for i in range(c.layers):
            keys[i][..., :9], values[i][:, :, :9] = new[2 * i], new[2 * i + 1]
        for k, x in enumerate(steps):
            position = 9 + k
            hidden, _, new = run_ours(step, x, position, [t for i in range(c.layers) for t in (keys[i], values[i])])
            got.append(hidden)
            for i in range(c.layers):
                keys[i][..., position], values[i][:, :, position] = new[2 * i][..., 0], new[2 * i + 1][:, :, 0]
        for w, g in zip(want, got):
            assert w.abs().max() > 0.1 and torch.allclose(w, g, atol=2e-5), (w - g).abs().max()
            assert torch.allclose(reference.codec_head(w), talker.codec_head(g), atol=2e-5)
