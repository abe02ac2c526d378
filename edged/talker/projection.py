"""A family's host-side MLP from the thinker's width to the talker's: Qwen3-Omni's `hidden_projection`
(transformers' `Qwen3OmniMoeTalkerResizeMLP`: linear_fc2(silu(linear_fc1(x))), both with bias), which
turns the thinker's hidden states of media placeholders into talker prompt rows.

Its weights are read from the artifact's `embeddings.safetensors` (only these four tensors) and
shape-checked at load; it runs once per request, when the request's prompt is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors import safe_open

from edged.artifact.manifest import ArtifactError

NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class Projection:
    def __init__(self, fc1: np.ndarray, b1: np.ndarray, fc2: np.ndarray, b2: np.ndarray):
        self.fc1_t, self.b1 = np.ascontiguousarray(fc1.T, np.float32), b1.astype(np.float32)
        self.fc2_t, self.b2 = np.ascontiguousarray(fc2.T, np.float32), b2.astype(np.float32)

    @property
    def width(self) -> int:
        """The width of the rows it takes."""
        return self.fc1_t.shape[0]

    @classmethod
    def load(cls, path: Path, prefix: str, width_in: int, width_out: int) -> Projection:
        """`{prefix}.fc1.weight` [I, width_in], `.fc1.bias` [I], `.fc2.weight` [width_out, I],
        `.fc2.bias` [width_out] from the safetensors file at `path`."""
        try:
            with safe_open(str(path), "np") as f:
                stored = set(f.keys())
                missing = [f"{prefix}.{n}" for n in NAMES if f"{prefix}.{n}" not in stored]
                if missing:
                    raise ArtifactError(f"{path.name}: missing tensor {missing[0]!r}")
                w1, b1, w2, b2 = (f.get_tensor(f"{prefix}.{n}") for n in NAMES)
        except ArtifactError:
            raise
        except Exception as exc:  # safetensors raises several types for a corrupt file
            raise ArtifactError(f"{path.name}: cannot be read ({exc})") from exc
        inner = w1.shape[0] if w1.ndim == 2 else -1
        for name, got, want in (("fc1.weight", w1.shape, (inner, width_in)), ("fc1.bias", b1.shape, (inner,)),
                                ("fc2.weight", w2.shape, (width_out, inner)), ("fc2.bias", b2.shape, (width_out,))):
            if got != want:
                raise ArtifactError(f"{path.name}: tensor '{prefix}.{name}' has shape {got}, expected {want} "
                                    f"(artifact.json dims: thinker width {width_in}, talker width {width_out})")
        return cls(w1, b1, w2, b2)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[n, width_in] (any float dtype) -> [n, width_out] float32."""
        h = x.astype(np.float32) @ self.fc1_t + self.b1
        h *= 1.0 / (1.0 + np.exp(-h))  # silu
        return h @ self.fc2_t + self.b2
