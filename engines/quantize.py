"""Weight-only int8 / int4 artifacts: quantized matrix weights behind DequantizeLinear, in the form
the target backend runs (`engines/weight_form.py`: `--target cpu` for ONNX Runtime's MatMulNBits in
an fp32 network, `--target jetson` for TensorRT 10.3's INT4 weight-only GEMMs in an fp16 network).

The Jetson form is the fp16 network of engines/fp16.py (fp16 activations and KV cache, fp32 norms,
softmax, heads and sampler) whose fp16 matrix weights become INT4 blocks with fp16 scales: each
DequantizeLinear's fp16 output feeds its fp16 MatMul directly. `quantize --target jetson` takes an
fp16 artifact, or an fp32 one that it first makes the fp16 network of (in `out`). The fp32 islands'
weights (the logit heads) stay fp32, unquantized, as the fp16 network keeps them; the vocoder is the
fp16 network's. A graph with gathered stacks of experts (Qwen3-Omni) has no Jetson form: their
gathered forms (engines/experts.py) are ONNX Runtime's only, so it is refused before anything is
written.

Every matrix product of the talker and code-predictor graphs whose weight is a constant (MatMul over
[K, N] or over Transpose([N, K]), and a logit head's Gemm with transB, turned into MatMul) reads it
through `DequantizeLinear(q, scale, axis=0, block_size=B)` as its form says. Embeddings (Gather),
norms, biases, the sampler's constants and the other Gather-read tables (the code predictor's stacked
heads) stay as they are; Qwen3-Omni's stacked experts, which a step gathers, take the gathered forms
of engines/experts.py (same bits, block and scales). So does a weight that several products
read: ONNX Runtime fuses a DequantizeLinear into MatMulNBits only when one product reads it, and an
unfused one dequantizes the whole matrix at every call (2-7x slower than fp32, measured on a
code-predictor graph that unrolled its passes); so does a weight whose K is not a multiple of the
block. The graphs move to opset 21 (blocked DequantizeLinear and INT4 need it)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edged.artifact.manifest import VOCODER_INT8, VOCODER_UINT8
from engines.experts import gathered_stacks, quantize_stacks
from engines.fp16 import convert_artifact
from engines.onnx_data import read_initializer, rewrite_file, set_nodes
from engines.vocoder_int8 import quantize_vocoder
from engines.weight_form import CPU_BLOCKS, FormError, WeightForm, cpu_block, dequantize, form, quantize_block, vocoder_form

__all__ = ["default_cpu_block", "dequantize", "quantize_artifact", "quantize_block", "quantize_file", "quantize_model",
           "set_nodes"]

GRAPHS = ("talker", "code_predictor")
OPSET = 21
CONSTANTS = "lifted_tensor"
"""Constants the exporter lifted from the code (the sampler's triangular matrix): never weights."""
EXPERTS_REFUSAL = ("gathered experts (Qwen3-Omni) have no Jetson form: TensorRT 10.3 dequantizes only 2-D INT4 "
                   "constants with a zero point of 0, never a gathered stack; run the fp16 artifact on the Jetson "
                   "(edged-engines fp16), or quantize with --target cpu for ONNX Runtime")


def quantize_model(model: onnx.ModelProto, weight_form: WeightForm, data_dir: Path = Path()) -> dict[str, int]:
    """Quantize `model`'s constant matrix weights and its gathered stacks of experts
    (engines/experts.py) in place, reading each from `data_dir` (the directory of external data)
    when it is quantized; returns counts of what was done."""
    graph = model.graph
    if weight_form.half and gathered_stacks(graph, (TensorProto.FLOAT, TensorProto.FLOAT16)):
        raise FormError(EXPERTS_REFUSAL)
    gathered = quantize_stacks(model, weight_form.bits, weight_form.block, weight_form.quantize, np.float32, data_dir)
    inits = {i.name: i for i in graph.initializer}
    transposes = {n.output[0]: n for n in graph.node if n.op_type == "Transpose"}
    readers = Counter(found[0] for node in graph.node if (found := _weight(node, inits, transposes, weight_form)))
    stats: Counter[str] = Counter()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        found = _weight(node, inits, transposes, weight_form)
        if found is None or readers[found[0]] > 1:
            if found is not None:
                stats[f"shared weights kept {'fp16' if weight_form.half else 'fp32'}"] += 1
            nodes.append(node)
            continue
        weight, transposed = found
        base = f"{weight}__t" if transposed else weight  # x @ W^T: a Linear's weight [N, K], read as [K, N]
        w = read_initializer(inits[weight], data_dir).astype(np.float32)
        made, product = weight_form.product(node.input[0], base, np.ascontiguousarray(w.T) if transposed else w,
                                            node.output[0], node.name)
        graph.initializer.extend(made)
        nodes.extend(product)
        stats["weights"] += 1
        stats["parameters"] += w.size
    set_nodes(graph, _live(nodes, {o.name for o in graph.output}))
    graph.ClearField("value_info")
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, OPSET)
    model.ir_version = max(model.ir_version, 10)
    return {**stats, **gathered}


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes something still reads (the Transposes of quantized weights are left unread)."""
    needed, keep = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(node.input)
    return keep[::-1]


def _weight(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], transposes: dict[str, onnx.NodeProto],
            weight_form: WeightForm) -> tuple[str, bool] | None:
    """(the constant weight, whether the product reads it transposed) of a matrix product this module
    quantizes: MatMul over an initializer or over Transpose(initializer), Gemm with transB; else None."""
    if node.op_type == "MatMul":
        name, transposed = node.input[1], False
        source = transposes.get(name)
        if source is not None and [a.ints for a in source.attribute if a.name == "perm"] in ([[1, 0]], []):
            name, transposed = source.input[0], True
    elif node.op_type == "Gemm" and len(node.input) == 2:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0) or not attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0:
            return None
        name, transposed = node.input[1], True
    else:
        return None
    init = inits.get(name)
    kind = TensorProto.FLOAT16 if weight_form.half else TensorProto.FLOAT  # jetson: the fp16 network's, not its islands'
    if init is None or init.data_type != kind or len(init.dims) != 2 or init.name.startswith(CONSTANTS):
        return None
    rows = init.dims[1] if transposed else init.dims[0]
    return (init.name, transposed) if weight_form.fits(rows) else None


def weight_rows(path: Path) -> list[int]:
    """K of every weight in the graph file that some block could quantize: the matrix products'
    (`_weight`) and the gathered stacks' (engines/experts.py)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name: i for i in graph.initializer}
    transposes = {n.output[0]: n for n in graph.node if n.op_type == "Transpose"}
    smallest = WeightForm("cpu", "int8", CPU_BLOCKS[-1])
    rows = []
    for node in graph.node:
        if found := _weight(node, inits, transposes, smallest):
            init = inits[found[0]]
            rows.append(init.dims[1] if found[1] else init.dims[0])
    return rows + [init.dims[1] for _, init in gathered_stacks(graph).values()]


def default_cpu_block(artifact) -> int:
    """The block the CPU form takes by default for an fp32 artifact (an edged.artifact.Artifact):
    the largest of CPU_BLOCKS that divides the K of every talker and code-predictor weight."""
    return cpu_block(k for role in GRAPHS if role in artifact.graphs for k in weight_rows(artifact.file(role)))


def quantize_file(path: Path, out: Path, weight_form: WeightForm) -> dict[str, int]:
    """Quantize one graph file, its weights read one at a time (`out` may be `path`)."""
    return rewrite_file(path, out, lambda model, data_dir: quantize_model(model, weight_form, data_dir))


INT8_VOCODER_FILE = "vocoder_int8.onnx"
UINT8_VOCODER_FILE = "vocoder_uint8.onnx"
"""The int8 vocoder's twin with its weights as uint8, for CPUs whose uint8 x int8 products saturate."""


def quantize_artifact(src: Path, out: Path, weights: str | None, target: str = "cpu",
                      block: int | None = None, vocoder: str | None = None) -> dict[str, dict[str, int]]:
    """A twin of an artifact with its talker and code predictor's weights int8 / int4 in the form
    `target` runs (`weights`), its vocoder's convolutions int8 (`vocoder`: engines/vocoder_int8.py), or
    both (out may be src: quantized in place); per graph, what was quantized. The cpu form takes an
    fp32 artifact; the jetson form an fp16 one, or an fp32 one that becomes the fp16 network first. A
    form the target cannot run is a FormError, raised before anything is written."""
    from edged.artifact import load_artifact

    if weights is None and vocoder is None:
        raise ValueError("nothing to quantize: give weights (int8 / int4), vocoder (int8), or both")
    artifact = load_artifact(src)
    if vocoder is not None:
        vocoder_form(vocoder, target)
        if artifact.vocoder_weights != "fp32":
            raise ValueError(f"{src}: the vocoder is already {artifact.vocoder_weights}")
    weight_form = None
    if weights is not None:
        weight_form = form(weights, target, block if block is not None or target != "cpu" else default_cpu_block(artifact))
    half = weight_form is not None and weight_form.half
    if weight_form is not None and (artifact.weights != "fp32" or
                                    artifact.precision not in (("fp32", "fp16") if half else ("fp32",))):
        wanted = "an fp32 or fp16 one" if half else "an fp32 one"
        raise ValueError(f"{src}: the artifact is {artifact.precision} with {artifact.weights} weights; quantize {wanted}")
    if vocoder is not None and artifact.precision != "fp32":  # its weights may be quantized already
        raise ValueError(f"{src}: the int8 vocoder needs an fp32 network, the artifact is {artifact.precision}")
    if half and _has_experts(artifact):
        raise FormError(EXPERTS_REFUSAL)
    stats: dict[str, dict[str, int]] = {}
    if half and artifact.precision == "fp32":
        stats = {f"{role} (fp16 network)": counts for role, counts in convert_artifact(src, out).items()}
        src, artifact = out, load_artifact(out)
    out.mkdir(parents=True, exist_ok=True)
    for role, graph in artifact.graphs.items():
        if role in GRAPHS and weight_form is not None:
            stats[role] = quantize_file(artifact.file(role), out / graph.file, weight_form)
        elif (out / graph.file).resolve() != artifact.file(role).resolve():
            _copy_graph(artifact.file(role), out / graph.file)
        if role == "vocoder" and vocoder is not None:  # the int8 twins beside the fp32 graph
            stats[role] = rewrite_file(artifact.file(role), out / INT8_VOCODER_FILE, quantize_vocoder)
            rewrite_file(artifact.file(role), out / UINT8_VOCODER_FILE,
                         lambda model, data_dir: quantize_vocoder(model, data_dir, unsigned=True))
    for name in artifact.files.values():
        if (out / name).resolve() != (src / name).resolve():
            shutil.copy(src / name, out / name)
    made = artifact
    if weight_form is not None:
        made = replace(made, weights=weights, weight_block=weight_form.block, weight_target=target)
    if vocoder is not None:
        fp32 = artifact.graphs["vocoder"]
        twins = {VOCODER_INT8: replace(fp32, file=INT8_VOCODER_FILE), VOCODER_UINT8: replace(fp32, file=UINT8_VOCODER_FILE)}
        made = replace(made, vocoder_weights=vocoder, graphs={**made.graphs, **twins})
    (out / "artifact.json").write_text(json.dumps(made.to_json(), indent=2) + "\n")
    return stats


def _has_experts(artifact) -> bool:
    """Whether the talker or code predictor gathers stacks of experts (engines/experts.py)."""
    return any(gathered_stacks(onnx.load(str(artifact.file(role)), load_external_data=False).graph,
                               (TensorProto.FLOAT, TensorProto.FLOAT16))
               for role in GRAPHS if role in artifact.graphs)


def _copy_graph(path: Path, out: Path) -> None:
    shutil.copy(path, out)
    data = path.with_name(path.name + ".data")
    if data.exists():
        shutil.copy(data, out.with_name(data.name))
