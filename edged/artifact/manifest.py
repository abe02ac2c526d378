"""The artifact manifest (`artifact.json`): one definition, read by the runtime, written by the toolchain.

`Manifest.to_json()` is what `edged-engines export` writes and `Manifest.from_json()` is what the
runtime reads, so the two can never drift apart. Reading checks every key's presence and type and
names the key that is wrong; what a family requires beyond that (its special ids, its graphs) is
checked by the family (`edged.families`). The layout is documented in docs/artifact.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edged.request import SAMPLING_KEYS


class ArtifactError(ValueError):
    """An artifact that cannot be served; the message names the file and key."""


FORMAT = 1
PRECISIONS = ("fp32", "fp16")
WEIGHTS = ("fp32", "int8", "int4")
WEIGHT_TARGETS = ("cpu", "jetson")
VOCODER_WEIGHTS = ("fp32", "int8")
VOCODER_INT8 = "vocoder_int8"
"""The graph of the int8 vocoder, beside the fp32 `vocoder` (vocoder_weights int8)."""
VOCODER_UINT8 = "vocoder_uint8"
"""The int8 vocoder's values stored as uint8 (zero point 128), beside it: the form for CPUs whose
uint8 x int8 products saturate (edged/vocoder/form.py). Artifacts quantized before it have none."""
VOCODER_TWINS = (VOCODER_INT8, VOCODER_UINT8)


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    """Talker (codec) vocabulary: codes and specials."""
    text_vocab: int
    text_hidden: int
    code_groups: int
    codebook_size: int
    """Code-predictor vocabulary."""


@dataclass(frozen=True)
class Speaker:
    id: int
    dialect: str | None = None
    """A language key this voice forces when the language is chinese or auto (Qwen3-TTS dialect voices)."""


@dataclass(frozen=True)
class StateSpec:
    """One carried state tensor of a streaming graph: read as `input`, written as `output`."""

    input: str
    output: str
    shape: tuple[int, ...]
    """Without the leading batch axis."""


@dataclass(frozen=True)
class Graph:
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    state: tuple[StateSpec, ...] = ()


@dataclass(frozen=True)
class Manifest:
    family: str
    model_type: str
    supports_instruct: bool
    precision: str
    """fp32, or fp16: an fp16 network (fp16 activations, weights and KV cache) with fp32 norms, softmax,
    heads and sampling (engines/fp16.py); the Jetson int4 form is one."""
    dims: Dims
    max_batch: int
    max_seq: int
    special: dict[str, int]
    speakers: dict[str, Speaker]
    languages: dict[str, int]
    sample_rate: int
    samples_per_frame: int
    sampling: dict[str, float]
    graphs: dict[str, Graph]
    """Every ONNX graph, required and optional, by role (talker, vocoder, speaker_encoder, ...)."""
    files: dict[str, str]
    """The other files by role (embeddings, tokenizer)."""
    layout: str = "tts"
    """The talker's prompt layout (the family's prefill builder): tts (Qwen3-TTS) or segments (Qwen3-Omni)."""
    lead_samples: int = 0
    """Samples at the start of every vocoder stream that are not audio (the host drops them; 555 for
    Qwen3-Omni's code2wav, whose reference cuts them)."""
    weights: str = "fp32"
    """The matrix weights of the talker and code predictor graphs: fp32, or int8 / int4 block-quantized
    (symmetric, `weight_block` rows of a column per scale, DequantizeLinear before each MatMul;
    engines/quantize.py)."""
    weight_block: int = 0
    """Rows per quantization scale (0 for fp32 weights)."""
    weight_target: str = ""
    """Which backend's kernels the quantized form is for: cpu (ONNX Runtime's MatMulNBits: fp32 scales)
    or jetson (TensorRT 10.3: INT4 in blocks of 64 or 128, fp16 scales, in an fp16 network: precision
    fp16); "" for fp32 weights (engines/weight_form.py)."""
    vocoder_weights: str = "fp32"
    """The vocoder forms: fp32 (the `vocoder` graph alone), or int8: a `vocoder_int8` graph beside it whose
    convolutions are dynamically quantized 8-bit products (ONNX Runtime's form only: engines/vocoder_int8.py),
    and its `vocoder_uint8` twin (the same values as uint8), each run where the CPU's 8-bit products are
    exact and fast (edged/vocoder/form.py)."""

    @property
    def frame_ms(self) -> float:
        return 1000.0 * self.samples_per_frame / self.sample_rate

    def stream_samples(self, frames: int) -> int:
        """Audio samples of a stream of `frames` codec frames (its lead left out)."""
        return max(0, frames * self.samples_per_frame - self.lead_samples)

    # ------------------------------------------------------------------------------ write

    def to_json(self) -> dict[str, Any]:
        tensors: dict[str, Any] = {}
        for role, g in self.graphs.items():
            tensors[role] = {"inputs": list(g.inputs), "outputs": list(g.outputs)}
            if g.state:
                tensors[role]["state"] = [{"input": s.input, "output": s.output, "shape": list(s.shape)} for s in g.state]
        return {
            "format": FORMAT,
            "family": self.family,
            "model": {"type": self.model_type, "instruct": self.supports_instruct, "precision": self.precision,
                      "layout": self.layout, "weights": self.weights, "weight_block": self.weight_block,
                      **({"weight_target": self.weight_target} if self.weight_target else {}),
                      **({"vocoder_weights": self.vocoder_weights} if self.vocoder_weights != "fp32" else {})},
            "files": {**{role: g.file for role, g in self.graphs.items()}, **self.files},
            "dims": asdict(self.dims),
            "limits": {"max_batch": self.max_batch, "max_seq": self.max_seq},
            "special": dict(self.special),
            "speakers": {name: asdict(s) for name, s in self.speakers.items()},
            "languages": dict(self.languages),
            "audio": {"sample_rate": self.sample_rate, "frame_rate": self.sample_rate / self.samples_per_frame,
                      "samples_per_frame": self.samples_per_frame, "lead_samples": self.lead_samples},
            "sampling": dict(self.sampling),
            "tensors": tensors,
        }

    # ------------------------------------------------------------------------------ read

    @classmethod
    def from_json(cls, m: Any) -> Manifest:
        """Validate the JSON object of artifact.json; every error names the key."""
        if not isinstance(m, dict):
            raise ArtifactError("artifact.json: top level must be an object")
        if _get(m, "format", int) != FORMAT:
            raise ArtifactError(f"artifact.json: format {m['format']} is not supported (this edged reads {FORMAT})")
        family = _get(m, "family", str)
        model = _get(m, "model", dict)
        if not isinstance(model.get("type"), str) or not isinstance(model.get("instruct"), bool):
            raise ArtifactError("artifact.json: 'model' needs a string 'type' and a boolean 'instruct'")
        precision = model.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise ArtifactError(f"artifact.json: 'model.precision' must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        weights, block = model.get("weights", "fp32"), model.get("weight_block", 0)
        if weights not in WEIGHTS:
            raise ArtifactError(f"artifact.json: 'model.weights' must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        if not isinstance(block, int) or isinstance(block, bool) or (block > 0) != (weights != "fp32"):
            raise ArtifactError(f"artifact.json: 'model.weight_block' must be a positive integer for quantized "
                                f"weights and 0 for fp32, got {block!r}")
        target = model.get("weight_target", "")
        if weights != "fp32" and "weight_target" not in model:
            raise ArtifactError(f"artifact.json: missing key 'model.weight_target' ({', '.join(WEIGHT_TARGETS)}: which "
                                f"backend the {weights} form is for; quantize the fp32 artifact again to record it)")
        if target not in (WEIGHT_TARGETS if weights != "fp32" else ("",)):
            raise ArtifactError(f"artifact.json: 'model.weight_target' must be one of {', '.join(WEIGHT_TARGETS)} for "
                                f"quantized weights and absent for fp32, got {target!r}")
        network = "fp16" if target == "jetson" else "fp32"  # the Jetson form is an fp16 network, the CPU form fp32
        if weights != "fp32" and precision != network:
            raise ArtifactError(f"artifact.json: 'model.weights' {weights} for {target} needs 'model.precision' "
                                f"{network}, got {precision} (quantize the fp32 artifact again with --target {target})")
        vocoder_weights = model.get("vocoder_weights", "fp32")
        if vocoder_weights not in VOCODER_WEIGHTS:
            raise ArtifactError(f"artifact.json: 'model.vocoder_weights' must be one of {', '.join(VOCODER_WEIGHTS)}, "
                                f"got {vocoder_weights!r}")
        if vocoder_weights != "fp32" and precision != "fp32":
            raise ArtifactError(f"artifact.json: 'model.vocoder_weights' {vocoder_weights} needs 'model.precision' fp32, "
                                f"got {precision}")
        layout = model.get("layout", "tts")
        if not isinstance(layout, str):
            raise ArtifactError(f"artifact.json: 'model.layout' must be a string, got {layout!r}")
        dims_raw = _get(m, "dims", dict)
        dims = Dims(**{k: _positive(dims_raw, k, "dims") for k in Dims.__dataclass_fields__})
        limits = _get(m, "limits", dict)
        special_raw = _get(m, "special", dict)
        languages_raw = _get(m, "languages", dict)
        languages = {str(k).lower(): _int(languages_raw, k, "languages") for k in languages_raw}
        speakers = {}
        for name, s in _get(m, "speakers", dict).items():
            if not isinstance(s, dict):
                raise ArtifactError(f"artifact.json: speakers.{name} must be an object")
            dialect = s.get("dialect")
            if dialect is not None and dialect not in languages:
                raise ArtifactError(f"artifact.json: speakers.{name}.dialect {dialect!r} is not in languages")
            speakers[str(name).lower()] = Speaker(id=_int(s, "id", f"speakers.{name}"), dialect=dialect)
        audio = _get(m, "audio", dict)
        samples_per_frame = _positive(audio, "samples_per_frame", "audio")
        lead = audio.get("lead_samples", 0)
        if not isinstance(lead, int) or isinstance(lead, bool) or not 0 <= lead < samples_per_frame:
            raise ArtifactError(f"artifact.json: 'audio.lead_samples' must be an integer in [0, samples_per_frame), "
                                f"got {lead!r}")
        sampling_raw = _get(m, "sampling", dict)
        files_raw = _get(m, "files", dict)
        tensors_raw = _get(m, "tensors", dict)
        graphs = {role: _graph(role, t, files_raw) for role, t in tensors_raw.items()}
        if (vocoder_weights == "int8") != (VOCODER_INT8 in graphs):
            raise ArtifactError(
                f"artifact.json: 'model.vocoder_weights' {vocoder_weights} "
                + ("with a 'tensors.vocoder_int8' graph: the int8 twin needs vocoder_weights int8" if VOCODER_INT8 in graphs
                   else "names no 'tensors.vocoder_int8' graph: this artifact's vocoder.onnx is the int8 graph itself, "
                        "from an earlier edged-engines, with no fp32 vocoder for CPUs where int8 runs wrong; "
                        "quantize the fp32 artifact again (edged-engines quantize --vocoder int8)"))
        if VOCODER_UINT8 in graphs and VOCODER_INT8 not in graphs:
            raise ArtifactError("artifact.json: a 'tensors.vocoder_uint8' graph without 'tensors.vocoder_int8': "
                                "the uint8 form is the int8 vocoder's twin")
        files = {}
        for role, name in files_raw.items():
            if role in graphs:
                continue
            if not isinstance(name, str):
                raise ArtifactError(f"artifact.json: 'files.{role}' must be a file name")
            files[role] = name
        return cls(
            family=family, model_type=model["type"], supports_instruct=model["instruct"], precision=precision, dims=dims,
            max_batch=_positive(limits, "max_batch", "limits"), max_seq=_positive(limits, "max_seq", "limits"),
            special={k: _int(special_raw, k, "special") for k in special_raw}, speakers=speakers,
            languages=languages, sample_rate=_positive(audio, "sample_rate", "audio"),
            samples_per_frame=samples_per_frame,
            sampling={k: _number(sampling_raw, k, "sampling") for k in SAMPLING_KEYS
                      if k not in ("seed", "cp_spec_verify_size")},  # the model's generation defaults
            graphs=graphs, files=files, layout=layout, lead_samples=lead, weights=weights, weight_block=block,
            weight_target=target, vocoder_weights=vocoder_weights,
        )


def _graph(role: str, t: Any, files: dict) -> Graph:
    if not isinstance(t, dict) or not isinstance(t.get("inputs"), list) or not isinstance(t.get("outputs"), list):
        raise ArtifactError(f"artifact.json: missing key 'tensors.{role}' (with inputs and outputs lists)")
    if not isinstance(files.get(role), str):
        raise ArtifactError(f"artifact.json: missing key 'files.{role}' (the file of graph {role})")
    inputs, outputs = tuple(t["inputs"]), tuple(t["outputs"])
    state = []
    for i, s in enumerate(t.get("state", [])):
        where = f"tensors.{role}.state[{i}]"
        if not (isinstance(s, dict) and isinstance(s.get("input"), str) and isinstance(s.get("output"), str)
                and isinstance(s.get("shape"), list) and all(isinstance(d, int) and d > 0 for d in s["shape"])):
            raise ArtifactError(f"artifact.json: '{where}' needs 'input', 'output' and a positive integer 'shape'")
        if s["input"] not in inputs or s["output"] not in outputs:
            raise ArtifactError(f"artifact.json: '{where}' names tensors the {role} graph does not have")
        state.append(StateSpec(s["input"], s["output"], tuple(s["shape"])))
    return Graph(files[role], inputs, outputs, tuple(state))


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
