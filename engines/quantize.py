"""Weight-only int8 / int4 artifacts: block-quantized matrix weights behind DequantizeLinear.

Every matrix product of the talker and code-predictor graphs whose weight is a constant (MatMul over
[K, N] or over Transpose([N, K]), and a logit head's Gemm with transB, turned into MatMul) reads it
through `DequantizeLinear(q, scale, axis=0, block_size=B)`: symmetric, one fp32 scale per B
consecutive rows of a column (scale = max |w| / 127 or / 7 over the block), q = round(w / scale) as
INT8 or INT4 (two per byte, low nibble first). Qwen3-Omni's stacked experts, which a step gathers,
take the gathered forms of engines/experts.py (same bits, block and scales). Embeddings (Gather),
norms, biases, the sampler's constants and the other Gather-read tables (the code predictor's
stacked heads) stay as they are, and so does a weight that several products read: ONNX Runtime fuses a
DequantizeLinear into MatMulNBits only when one product reads it, and an unfused one dequantizes the
whole matrix at every call (2-7x slower than fp32, measured on a code-predictor graph that unrolled
its passes). The graphs move to opset 21 (blocked DequantizeLinear and INT4 need it). ONNX Runtime
fuses each DequantizeLinear + MatMul into its weight-only `MatMulNBits` kernel when it loads the
graph; TensorRT 10 builds the same graph, strongly typed, into weight-only INT4 kernels. Activations
stay fp32 in the graph."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.experts import quantize_stacks
from engines.onnx_data import read_initializer, save_streamed

BITS = {"int8": 8, "int4": 4}
BLOCK = 32
GRAPHS = ("talker", "code_predictor")
OPSET = 21
CONSTANTS = "lifted_tensor"
"""Constants the exporter lifted from the code (the sampler's triangular matrix): never weights."""


def quantize_block(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric block quantization of w [K, N] along K: q int8 [K, N] in [-2^(b-1), 2^(b-1) - 1] and
    scales [K / block, N] with w ~= q * scale (per block)."""
    k, n = w.shape
    qmax = 2 ** (bits - 1) - 1
    blocks = w.reshape(k // block, block, n)
    scale = np.abs(blocks).max(axis=1) / qmax
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[:, None, :]), -qmax - 1, qmax).astype(np.int8)
    return q.reshape(k, n), scale


def dequantize(q: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    k, n = q.shape
    return (q.reshape(k // block, block, n).astype(np.float32) * scale[:, None, :]).reshape(k, n)


def _tensor(name: str, q: np.ndarray, bits: int) -> onnx.TensorProto:
    if bits == 8:
        return helper.make_tensor(name, TensorProto.INT8, q.shape, q.tobytes(), raw=True)
    nibbles = (q.reshape(-1).astype(np.uint8) & 0x0F)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
    return helper.make_tensor(name, TensorProto.INT4, q.shape, packed.tobytes(), raw=True)


def quantize_model(model: onnx.ModelProto, bits: int, block: int = BLOCK, data_dir: Path = Path()) -> dict[str, int]:
    """Quantize `model`'s constant matrix weights and its gathered stacks of experts
    (engines/experts.py) in place, reading each from `data_dir` (the directory of external data)
    when it is quantized; returns counts of what was done."""
    graph = model.graph
    gathered = quantize_stacks(model, bits, block, lambda w: quantize_block(w, bits, block), np.float32, data_dir)
    inits = {i.name: i for i in graph.initializer}
    transposes = {n.output[0]: n for n in graph.node if n.op_type == "Transpose"}
    readers = Counter(found[0] for node in graph.node if (found := _weight(node, inits, transposes, block)))
    stats: Counter[str] = Counter()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        found = _weight(node, inits, transposes, block)
        if found is None or readers[found[0]] > 1:
            if found is not None:
                stats["shared weights kept fp32"] += 1
            nodes.append(node)
            continue
        weight, transposed = found
        base = f"{weight}__t" if transposed else weight  # x @ W^T: a Linear's weight [N, K], read as [K, N]
        w = read_initializer(inits[weight], data_dir).astype(np.float32)
        q, scale = quantize_block(np.ascontiguousarray(w.T) if transposed else w, bits, block)
        graph.initializer.extend([_tensor(f"{base}__q{bits}", q, bits), numpy_helper.from_array(scale, f"{base}__scale")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{base}__q{bits}", f"{base}__scale"], [f"{base}__dq"],
                                      axis=0, block_size=block, name=f"{base}__dq"))
        nodes.append(helper.make_node("MatMul", [node.input[0], f"{base}__dq"], list(node.output), name=node.name))
        stats["weights"] += 1
        stats["parameters"] += w.size
    nodes = _live(nodes, {o.name for o in graph.output})
    used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    graph.ClearField("node")
    graph.node.extend(nodes)
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
            block: int) -> tuple[str, bool] | None:
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
    if init is None or init.data_type != TensorProto.FLOAT or len(init.dims) != 2 or init.name.startswith(CONSTANTS):
        return None
    rows = init.dims[1] if transposed else init.dims[0]
    return (init.name, transposed) if rows % block == 0 else None


def quantize_file(path: Path, out: Path, bits: int, block: int = BLOCK) -> dict[str, int]:
    """Quantize one graph file, its weights read one at a time (`out` may be `path`)."""
    model = onnx.load(str(path), load_external_data=False)
    stats = quantize_model(model, bits, block, Path(path).parent)
    save_streamed(model, Path(out), Path(path).parent)
    return stats


def quantize_artifact(src: Path, out: Path, weights: str, block: int = BLOCK) -> dict[str, dict[str, int]]:
    """An int8 / int4 twin of an fp32 artifact (out may be src: quantized in place); per graph, what
    was quantized."""
    from edged.artifact import load_artifact

    if weights not in BITS:
        raise ValueError(f"weights must be one of {', '.join(BITS)}, got {weights!r}")
    artifact = load_artifact(src)
    if artifact.precision != "fp32" or artifact.weights != "fp32":
        raise ValueError(f"{src}: the artifact is {artifact.precision} with {artifact.weights} weights; "
                         f"quantize an fp32 one")
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for role, graph in artifact.graphs.items():
        if role in GRAPHS:
            stats[role] = quantize_file(artifact.file(role), out / graph.file, BITS[weights], block)
        elif (out / graph.file).resolve() != artifact.file(role).resolve():
            _copy_graph(artifact.file(role), out / graph.file)
    for name in artifact.files.values():
        if (out / name).resolve() != (src / name).resolve():
            shutil.copy(src / name, out / name)
    manifest = replace(artifact, weights=weights, weight_block=block).to_json()
    (out / "artifact.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return stats


def _copy_graph(path: Path, out: Path) -> None:
    shutil.copy(path, out)
    data = path.with_name(path.name + ".data")
    if data.exists():
        shutil.copy(data, out.with_name(data.name))
