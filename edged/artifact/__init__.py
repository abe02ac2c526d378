"""The engine artifact: `artifact.json` plus the files it names, validated once at load.

Every error names the file and the key that is wrong, so a bad artifact fails at boot with a
message a person can act on, never later inside a step. The manifest's schema is `manifest.py`
(written by `edged-engines export` from the same definition); what a family requires beyond it is
checked by the family. The layout is documented in docs/artifact.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from edged.artifact.manifest import ArtifactError, Dims, Graph, Manifest, Speaker, StateSpec

BUILTIN = Path(__file__).resolve().parent.parent / "data" / "tiny"


@dataclass(frozen=True, kw_only=True)
class Artifact(Manifest):
    path: Path

    def file(self, role: str) -> Path:
        """The file of a graph or sidecar by its role (talker, vocoder, tokenizer, ...)."""
        return self.path / (self.graphs[role].file if role in self.graphs else self.files[role])

    def tables(self) -> dict[str, np.ndarray]:
        """The family's host tables (embeddings.safetensors), shape-checked against the manifest."""
        from edged.families import get_family

        path = self.file("embeddings")
        try:
            tables = load_file(str(path))
        except Exception as exc:  # safetensors raises several types for a corrupt file
            raise ArtifactError(f"{path.name}: cannot be read ({exc})") from exc
        expected = get_family(self.family).table_shapes(self.dims)
        for key, shape in expected.items():
            if key not in tables:
                raise ArtifactError(f"{path.name}: missing tensor {key!r}")
            if len(tables[key].shape) != len(shape) or any(w not in (None, n) for w, n in zip(shape, tables[key].shape)):
                implied = "(" + ", ".join("any" if n is None else str(n) for n in shape) + ")"
                raise ArtifactError(
                    f"{path.name}: tensor {key!r} has shape {tables[key].shape}, artifact.json dims imply {implied}")
        return {k: np.ascontiguousarray(tables[k], dtype=np.float32) for k in expected}


def load_artifact(path: Path | str | None = None) -> Artifact:
    """Read and validate the artifact at `path` (the built-in tiny artifact when None)."""
    from edged.families import get_family

    root = Path(path) if path is not None else BUILTIN
    manifest_path = root / "artifact.json"
    if not manifest_path.is_file():
        raise ArtifactError(f"{manifest_path}: no artifact.json (is {root} an artifact directory?)")
    try:
        raw = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"artifact.json: not valid JSON ({exc})") from exc
    manifest = Manifest.from_json(raw)
    get_family(manifest.family).check(manifest)
    for role, name in [*((r, g.file) for r, g in manifest.graphs.items()), *manifest.files.items()]:
        if not (root / name).is_file():
            raise ArtifactError(f"{name}: missing from the artifact (artifact.json files.{role})")
    return Artifact(**{f.name: getattr(manifest, f.name) for f in fields(Manifest)}, path=root)


__all__ = ["BUILTIN", "Artifact", "ArtifactError", "Dims", "Graph", "Manifest", "Speaker", "StateSpec", "load_artifact"]
