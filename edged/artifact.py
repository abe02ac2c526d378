"""The engine artifact: `artifact.json` plus the files it names, validated once at load.

Every error names the file and the key that is wrong, so a bad artifact fails at boot with a
message a person can act on, never later inside a step. The layout is documented in
docs/artifact.md and written by `edged-engines export`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

FORMAT = 1
FAMILIES = ("qwen3_tts",)
GRAPHS = ("talker_prefill", "talker_decode", "code_predictor", "vocoder")
DIM_KEYS = ("hidden", "layers", "kv_heads", "head_dim", "vocab", "text_vocab", "text_hidden",
            "code_groups", "codebook_size")
SPECIAL_KEYS = ("codec_pad", "codec_bos", "codec_eos", "codec_think", "codec_nothink",
                "codec_think_bos", "codec_think_eos", "tts_pad", "tts_bos", "tts_eos")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "repetition_penalty",
                 "cp_temperature", "cp_top_k", "cp_top_p")
BUILTIN = Path(__file__).parent / "data" / "tiny"


class ArtifactError(ValueError):
    """An artifact that cannot be served; the message names the file and key."""


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    text_vocab: int
    text_hidden: int
    code_groups: int
    codebook_size: int


@dataclass(frozen=True)
class Speaker:
    id: int
    dialect: str | None


@dataclass(frozen=True)
class StateSpec:
    """One carried state tensor of the streaming vocoder: read as `input`, written as `output`."""

    input: str
    output: str
    shape: tuple[int, ...]  # without the leading batch axis


@dataclass(frozen=True)
class Artifact:
    path: Path
    family: str
    model_type: str
    supports_instruct: bool
    dims: Dims
    max_batch: int
    max_seq: int
    special: dict[str, int]
    speakers: dict[str, Speaker]
    languages: dict[str, int]
    sample_rate: int
    samples_per_frame: int
    sampling: dict[str, float]
    tensors: dict[str, dict[str, list[str]]]
    vocoder_state: list[StateSpec]
    files: dict[str, Path]

    @property
    def frame_ms(self) -> float:
        return 1000.0 * self.samples_per_frame / self.sample_rate

    def tables(self) -> dict[str, np.ndarray]:
        """Host-side tables, shape-checked against the manifest."""
        path = self.files["embeddings"]
        try:
            tables = load_file(str(path))
        except Exception as exc:  # safetensors raises several types for a corrupt file
            raise ArtifactError(f"{path.name}: cannot be read ({exc})") from exc
        d = self.dims
        expected = {
            "text_projected": (d.text_vocab, d.hidden),
            "codec_embedding": (d.vocab, d.hidden),
            "tts_bos": (d.hidden,), "tts_eos": (d.hidden,), "tts_pad": (d.hidden,),
        }
        for key, shape in expected.items():
            if key not in tables:
                raise ArtifactError(f"{path.name}: missing tensor {key!r}")
            if tables[key].shape != shape:
                raise ArtifactError(
                    f"{path.name}: tensor {key!r} has shape {tables[key].shape}, artifact.json dims imply {shape}")
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tables.items()}


def load_artifact(path: Path | str | None = None) -> Artifact:
    """Read and validate the artifact at `path` (the built-in tiny artifact when None)."""
    root = Path(path) if path is not None else BUILTIN
    manifest_path = root / "artifact.json"
    if not manifest_path.is_file():
        raise ArtifactError(f"{manifest_path}: no artifact.json (is {root} an artifact directory?)")
    try:
        m = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"artifact.json: not valid JSON ({exc})") from exc
    if not isinstance(m, dict):
        raise ArtifactError("artifact.json: top level must be an object")

    if _get(m, "format", int) != FORMAT:
        raise ArtifactError(f"artifact.json: format {m['format']} is not supported (this edged reads {FORMAT})")
    family = _get(m, "family", str)
    if family not in FAMILIES:
        raise ArtifactError(f"artifact.json: family {family!r} is not supported (known: {', '.join(FAMILIES)})")

    model = _get(m, "model", dict)
    if not isinstance(model.get("type"), str) or not isinstance(model.get("instruct"), bool):
        raise ArtifactError("artifact.json: 'model' needs a string 'type' and a boolean 'instruct'")

    dims_raw = _get(m, "dims", dict)
    dims = Dims(**{k: _positive(dims_raw, k, "dims") for k in DIM_KEYS})
    limits = _get(m, "limits", dict)
    special_raw = _get(m, "special", dict)
    special = {k: _int(special_raw, k, "special") for k in special_raw}
    for k in SPECIAL_KEYS:
        _int(special_raw, k, "special")
    for k in ("codec_pad", "codec_bos", "codec_eos", "codec_think", "codec_nothink", "codec_think_bos", "codec_think_eos"):
        if not 0 <= special[k] < dims.vocab:
            raise ArtifactError(f"artifact.json: special.{k}={special[k]} is outside the talker vocab ({dims.vocab})")
    for k in ("tts_pad", "tts_bos", "tts_eos"):
        if not 0 <= special[k] < dims.text_vocab:
            raise ArtifactError(f"artifact.json: special.{k}={special[k]} is outside the text vocab ({dims.text_vocab})")

    languages = {str(k).lower(): _int(_get(m, "languages", dict), k, "languages")
                 for k in _get(m, "languages", dict)}
    speakers = {}
    for name, s in _get(m, "speakers", dict).items():
        if not isinstance(s, dict):
            raise ArtifactError(f"artifact.json: speakers.{name} must be an object")
        dialect = s.get("dialect")
        if dialect is not None and dialect not in languages:
            raise ArtifactError(f"artifact.json: speakers.{name}.dialect {dialect!r} is not in languages")
        speakers[str(name).lower()] = Speaker(id=_int(s, "id", f"speakers.{name}"), dialect=dialect)

    audio = _get(m, "audio", dict)
    sampling_raw = _get(m, "sampling", dict)
    sampling = {k: float(_number(sampling_raw, k, "sampling")) for k in SAMPLING_KEYS}

    files_raw = _get(m, "files", dict)
    files = {}
    for key in (*GRAPHS, "embeddings", "tokenizer"):
        name = files_raw.get(key)
        if not isinstance(name, str):
            raise ArtifactError(f"artifact.json: missing key 'files.{key}'")
        f = root / name
        if not f.is_file():
            raise ArtifactError(f"{name}: missing from the artifact (artifact.json files.{key})")
        files[key] = f

    tensors_raw = _get(m, "tensors", dict)
    tensors = {}
    for g in GRAPHS:
        t = tensors_raw.get(g)
        if not isinstance(t, dict) or not isinstance(t.get("inputs"), list) or not isinstance(t.get("outputs"), list):
            raise ArtifactError(f"artifact.json: missing key 'tensors.{g}' (with inputs and outputs lists)")
        tensors[g] = {"inputs": list(t["inputs"]), "outputs": list(t["outputs"])}
    vocoder_state = _vocoder_state(tensors_raw["vocoder"], tensors["vocoder"])

    return Artifact(
        path=root, family=family, model_type=model["type"], supports_instruct=model["instruct"], dims=dims,
        max_batch=_positive(limits, "max_batch", "limits"), max_seq=_positive(limits, "max_seq", "limits"),
        special=special, speakers=speakers, languages=languages,
        sample_rate=_positive(audio, "sample_rate", "audio"),
        samples_per_frame=_positive(audio, "samples_per_frame", "audio"),
        sampling=sampling, tensors=tensors, vocoder_state=vocoder_state, files=files,
    )


def _vocoder_state(raw: dict, names: dict[str, list[str]]) -> list[StateSpec]:
    state = raw.get("state")
    if not isinstance(state, list):
        raise ArtifactError("artifact.json: missing key 'tensors.vocoder.state' (the streaming vocoder's state list)")
    specs = []
    for i, s in enumerate(state):
        where = f"tensors.vocoder.state[{i}]"
        if not (isinstance(s, dict) and isinstance(s.get("input"), str) and isinstance(s.get("output"), str)
                and isinstance(s.get("shape"), list) and all(isinstance(d, int) and d > 0 for d in s["shape"])):
            raise ArtifactError(f"artifact.json: '{where}' needs 'input', 'output' and a positive integer 'shape'")
        if s["input"] not in names["inputs"] or s["output"] not in names["outputs"]:
            raise ArtifactError(f"artifact.json: '{where}' names tensors the vocoder does not have")
        specs.append(StateSpec(s["input"], s["output"], tuple(s["shape"])))
    return specs


def _get(d: dict, key: str, kind: type) -> Any:
    if key not in d:
        raise ArtifactError(f"artifact.json: missing key {key!r}")
    if not isinstance(d[key], kind):
        raise ArtifactError(f"artifact.json: {key!r} must be a {kind.__name__}")
    return d[key]


def _int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ArtifactError(f"artifact.json: missing or non-integer key '{where}.{key}'")
    return v


def _positive(d: dict, key: str, where: str) -> int:
    v = _int(d, key, where)
    if v <= 0:
        raise ArtifactError(f"artifact.json: '{where}.{key}' must be positive (got {v})")
    return v


def _number(d: dict, key: str, where: str) -> float:
    v = d.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ArtifactError(f"artifact.json: missing or non-numeric key '{where}.{key}'")
    return v
