"""Deterministic random weights for tiny checkpoints, every tensor from its own seeded generator.

The default HF init leaves degenerate weights (zero RVQ codebooks decode every code to the same
vector; zero SnakeBeta parameters; 1e-6 ConvNeXt gammas), so every tensor of a state dict is
re-initialized here from a generator seeded by (seed, tag, key): the same seed gives byte-identical
weights. A family passes gain overrides by key pattern (first `re.search` match wins; default 1,
which keeps activations near unit scale) and RMSNorm weight means by key pattern (default 1).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

Patterns = tuple[tuple[str, float], ...]


def reinit(model: nn.Module, seed: int, tag: str, part: str, *, gains: Patterns = (), norm_means: Patterns = ()) -> None:
    """Overwrite every tensor of `model.state_dict()` deterministically; fail on any unknown kind."""
    stored = set(model.state_dict())
    covered: set[str] = set()
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            for name, t in tensors:
                key = f"{mod_name}.{name}" if mod_name else name
                if key not in stored:
                    continue  # a non-persistent buffer (rotary tables): computed, not stored
                gen = torch.Generator().manual_seed(_tensor_seed(seed, tag, f"{part}/{key}"))
                t.copy_(_init_value(module, name, key, t, gen, gains, norm_means))
                covered.add(key)
    missing = stored - covered
    if missing:
        raise RuntimeError(f"tensors left without an init rule: {sorted(missing)[:10]}")


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built inside have `dtype` tensors (a real-size checkpoint built in bf16 needs half
    the memory of one built in fp32 and converted)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _tensor_seed(seed: int, tag: str, key: str) -> int:
    digest = hashlib.sha256(f"{seed}/{tag}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _normal(shape: torch.Size, std: float, gen: torch.Generator, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * std + mean


def _uniform(shape: torch.Size, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=gen) * (hi - lo) + lo


def _init_value(module: nn.Module, name: str, key: str, t: torch.Tensor, gen: torch.Generator,
                gains: Patterns, norm_means: Patterns) -> torch.Tensor:
    kind = type(module).__name__
    shape = t.shape
    gain = next((g for pattern, g in gains if re.search(pattern, key)), 1.0)
    if kind.endswith("RMSNorm") or (kind == "LayerNorm" and name == "weight"):
        mean = next((m for pattern, m in norm_means if re.search(pattern, key)), 1.0)
        return _normal(shape, 0.1, gen, mean=mean)
    if name == "bias" and kind in ("Linear", "Conv1d", "ConvTranspose1d", "LayerNorm"):
        return _normal(shape, 0.02, gen)
    if kind == "Linear":
        return _normal(shape, gain / math.sqrt(shape[1]), gen)
    if kind == "Conv1d":  # weight [out, in / groups, k]
        return _normal(shape, gain / math.sqrt(shape[1] * shape[2]), gen)
    if kind == "ConvTranspose1d":
        # weight [in, out, k]: every output sample sums in * k / stride taps
        return _normal(shape, gain / math.sqrt(shape[0] * shape[2] / module.stride[0]), gen)
    if kind == "Embedding":
        return _normal(shape, 1.0, gen)
    if kind == "SnakeBeta":  # log-parameters: alpha, beta = exp(.) around 1
        return _normal(shape, 0.2, gen)
    if name == "scale" and kind.endswith("LayerScale"):
        return _uniform(shape, 0.1, 0.3, gen)
    if name == "gamma" and kind.endswith("ConvNeXtBlock"):
        return _uniform(shape, 0.1, 0.3, gen)
    if kind == "EuclideanCodebook":
        return _codebook(name, t, gen, sum_name="embedding_sum")
    if kind == "MimiEuclideanCodebook":
        if name == "initialized":
            return torch.ones(shape)
        return _codebook(name, t, gen, sum_name="embed_sum")
    raise RuntimeError(f"no init rule for {key} ({kind}.{name}, shape {tuple(shape)})")


def _codebook(name: str, t: torch.Tensor, gen: torch.Generator, sum_name: str) -> torch.Tensor:
    """EMA codebook: embedding = embedding_sum / cluster_usage. Usage positive, embeddings ~N(0, 1)."""
    if name == "cluster_usage":
        return _uniform(t.shape, 0.5, 2.0, gen)
    if name == sum_name:
        # Scale rows by a usage drawn from the same seed stream, so the ratio stays ~N(0, 1).
        usage = _uniform(t.shape[:1], 0.5, 2.0, gen)
        return _normal(t.shape, 1.0, gen) * usage[:, None]
    raise RuntimeError(f"unexpected codebook tensor {name}")
