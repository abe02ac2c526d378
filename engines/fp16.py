"""fp16 networks with fp32 islands: a strongly typed ONNX graph for TensorRT (and ONNX Runtime).

Marking a whole network fp16 lets TensorRT run norms, softmax and the sampler in fp16: RMSNorm's
Pow/ReduceMean overflows, and the Gumbel noise log(-log(u)) is +inf for u near 1, which picks a
random token about half the time. Here instead the types are explicit in the graph. The talker, the
code predictor and the vocoder compute in fp16: their activations (residual stream, attention, MLP,
the vocoder's convolutions), the weights of their matrix products and convolutions, and the KV cache
(`past_keys_*` / `past_values_*` in, `new_keys_*` / `new_values_*` out, fp16 at the graph's edge, so
the runtime's cache buffers are fp16: half the bytes). These stay fp32 islands, cast in and out:

- norms: a square that feeds a mean (x^2 overflows fp16 past 256), the mean, its epsilon, the root,
  the division by it and the scaling by the norm's weight; LayerNormalization;
- softmax (attention's and the router's), the reductions, Exp and Log, TopK;
- the heads that make logits (Gemm, and a product with the bound `heads`) and everything after them:
  the sampler and its constants;
- a node that reads a constant fp16 cannot hold (a finite value past 65504);
- what no fp16 value reaches (positions, the rotary angles, the embeddings' Gather).

A node runs fp16 when it multiplies a weight (MatMul, Conv, ConvTranspose over a constant; a gathered
stack of experts, engines/experts.py) or reads an fp16 value and is no island; it runs fp32
otherwise. One Cast is made per value and type that needs it. Graph inputs and outputs other than
the KV cache keep their types (`hidden`, `pcm`, the vocoder's state and the sampler's inputs stay
fp32), so only the cache buffers change. TensorRT builds the graphs with STRONGLY_TYPED and honors
every cast; ONNX Runtime runs the same graphs on the CPU (it computes the fp16 nodes that have no fp16
CPU kernel in fp32 between casts). The clone encoders (speaker and codec encoders) run on ONNX
Runtime only and stay fp32.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.experts import gathered_stacks
from engines.onnx_data import read_initializer, rewrite_file, save_streamed

NETWORK_GRAPHS = ("talker", "code_predictor", "code_predictor_draft", "vocoder")
"""The graphs that become fp16 networks; the others (the clone encoders) stay fp32."""
KV = ("past_keys_", "past_values_", "new_keys_", "new_values_")
"""Graph inputs and outputs that are fp16 at the edge: the KV cache and its new rows."""
ISLANDS = {"ReduceMean", "ReduceSum", "ReduceLogSumExp", "ReduceMax", "Softmax", "LogSoftmax",
           "LayerNormalization", "TopK", "Gemm", "Log", "Exp", "Sqrt", "Reciprocal", "CumSum", "ArgMax"}
"""Ops that always run fp32."""
NORM_TAIL = {"Add", "Sub", "Mul", "Div"}
"""Ops that stay in a norm's island when all their varying inputs come from it (eps, 1/root, weight)."""
PRODUCTS = {"MatMul": 1, "Conv": 1, "ConvTranspose": 1}
"""Products of a weight (its input position): fp16 wherever their weight is a constant."""
CONSTANTS = "lifted_tensor"
"""Constants the exporter lifted from the code (the sampler's triangular matrix): never weights."""
ANY_TYPE = {"Cast", "Shape", "Size"}
"""Ops that read either type as it is (no cast made for them)."""
FP16_MAX = float(np.finfo(np.float16).max)
CONSTANT_CHECK = 4096
"""Constants of at most this many values are checked for fp16's range (weights are not)."""


def to_fp16(model: onnx.ModelProto, base: Path = Path()) -> onnx.ModelProto:
    """`model` as an fp16 network with fp32 islands (module docstring), in place (`base`: the
    directory of its external data, read one tensor at a time)."""
    graph = model.graph
    floats = _float_values(model)
    inits = {i.name: i for i in graph.initializer if i.data_type == TensorProto.FLOAT}
    half_edges = {v.name for v in (*graph.input, *graph.output) if v.name.startswith(KV) and v.name in floats}
    half = _precisions(graph, floats, inits, half_edges, base)

    # constants take the type of the nodes that read them: fp16 in place, or an fp16 twin beside an fp32 use
    needs: dict[str, set[bool]] = {}
    for at, node in enumerate(graph.node):
        if node.op_type not in ANY_TYPE:
            for name in node.input:
                if name in inits:
                    needs.setdefault(name, set()).add(half[at])
    constant = {}
    for name, kinds in needs.items():
        constant[name, False] = name
        if True in kinds:
            constant[name, True] = _convert(graph, inits[name], False in kinds, base)

    names: dict[tuple[str, bool], str] = {}  # (value, fp16?) -> the name that holds it in that type
    for value in graph.input:
        names[value.name, value.name in half_edges] = value.name
    declared = {o.name: o.name in half_edges for o in graph.output}
    nodes: list[onnx.NodeProto] = []

    def typed(value: str, want: bool) -> str:
        if (value, want) in constant:
            return constant[value, want]
        if (value, want) not in names:
            cast = f"{value}__{'fp16' if want else 'fp32'}"
            nodes.append(helper.make_node("Cast", [names[value, not want]], [cast], name=cast,
                                          to=TensorProto.FLOAT16 if want else TensorProto.FLOAT))
            names[value, want] = cast
        return names[value, want]

    for at, node in enumerate(list(graph.node)):
        mine = half[at]
        for i, name in enumerate(node.input):
            if name in floats:
                have = mine if (name, mine) in names or (name, mine) in constant else not mine
                node.input[i] = typed(name, have if node.op_type in ANY_TYPE else mine)
        casts = []
        for i, name in enumerate(node.output):
            if name not in floats:
                continue
            made = _cast_to(node) if node.op_type == "Cast" else mine
            if name in declared and declared[name] != made:  # a graph output of the other type: cast at the edge
                node.output[i] = f"{name}__{'fp16' if made else 'fp32'}"
                casts.append(helper.make_node("Cast", [node.output[i]], [name], name=f"{name}__edge",
                                              to=TensorProto.FLOAT16 if declared[name] else TensorProto.FLOAT))
                names[name, declared[name]] = name
            names[name, made] = node.output[i]
        nodes.append(node)
        nodes.extend(casts)
    for value in (*graph.input, *graph.output):
        if value.name in half_edges:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.ClearField("value_info")  # intermediate types changed; runtimes infer them again
    return model


def _precisions(graph: onnx.GraphProto, floats: set[str], inits: dict[str, onnx.TensorProto], half_edges: set[str],
                base: Path) -> list[bool]:
    """Whether each node runs fp16, in the graph's (topological) order."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    stacks = gathered_stacks(graph)
    gathers = {gather.output[0] for gather, _ in stacks.values()}
    half_values, islands = set(half_edges), set()
    half: list[bool] = []
    for node in graph.node:
        varying = [name for name in node.input if name in floats and name not in inits]
        weight = node.input[PRODUCTS[node.op_type]] if node.op_type in PRODUCTS and len(node.input) > 1 else ""
        weight = "" if weight.startswith(CONSTANTS) else weight
        square = node.op_type == "Pow" and all(r.op_type.startswith("Reduce") for r in readers.get(node.output[0], []))
        island = node.op_type in ISLANDS or square or _out_of_range(node, inits, base) or (
            node.op_type in NORM_TAIL and bool(varying) and (all(name in islands for name in varying) or (
                node.op_type == "Div" and node.input[1] in islands)))
        if node.op_type in ANY_TYPE:
            mine = False
        elif island:
            mine = False
            islands.update(node.output)
        else:
            mine = node.output[0] in gathers or weight in inits or weight in stacks or any(n in half_values for n in varying)
        half.append(mine)
        if mine or (node.op_type == "Cast" and _cast_to(node)):
            half_values.update(node.output)
    return half


def _out_of_range(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], base: Path) -> bool:
    """Whether the node reads a small constant with a finite value fp16 cannot hold."""
    for name in node.input:
        init = inits.get(name)
        if init is not None and int(np.prod(init.dims)) <= CONSTANT_CHECK:
            values = read_initializer(init, base)
            if np.any(np.isfinite(values) & (np.abs(values) > FP16_MAX)):
                return True
    return False


def _cast_to(node: onnx.NodeProto) -> bool:
    return next(a.i for a in node.attribute if a.name == "to") == TensorProto.FLOAT16


def _float_values(model: onnx.ModelProto) -> set[str]:
    """The names of the graph's fp32 values (inputs, initializers, outputs and intermediates)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    typed = (*graph.input, *graph.output, *graph.value_info)
    return {v.name for v in typed if v.type.tensor_type.elem_type == TensorProto.FLOAT} | \
        {i.name for i in graph.initializer if i.data_type == TensorProto.FLOAT}


def _convert(graph: onnx.GraphProto, init: onnx.TensorProto, shared: bool, base: Path) -> str:
    """The fp16 twin of an fp32 initializer (in place, unless fp32 uses of it remain)."""
    half = numpy_helper.from_array(read_initializer(init, base).astype(np.float16),
                                   f"{init.name}__fp16" if shared else init.name)
    if shared:
        graph.initializer.append(half)
    else:
        init.CopyFrom(half)
    return half.name


def convert_file(path: Path, out: Path) -> dict[str, int]:
    """Convert one graph file (its weights read and written one at a time, `out` may be `path`);
    returns how many initializers and casts it now has of each type."""
    model = to_fp16(onnx.load(str(path), load_external_data=False), Path(path).parent)
    save_streamed(model, Path(out), Path(path).parent)
    kinds = Counter(TensorProto.DataType.Name(i.data_type) for i in model.graph.initializer)
    return {"fp16 initializers": kinds["FLOAT16"], "fp32 initializers": kinds["FLOAT"],
            "casts": sum(n.op_type == "Cast" for n in model.graph.node)}


def convert_artifact(src: Path, out: Path) -> dict[str, dict[str, int]]:
    """An fp16 twin of an fp32 artifact (out may be src: converted in place); per graph, what it holds."""
    from edged.artifact import load_artifact

    artifact = load_artifact(src)
    if artifact.precision != "fp32":
        raise ValueError(f"{src}: the artifact is already {artifact.precision}")
    if artifact.weights != "fp32":
        raise ValueError(f"{src}: its weights are {artifact.weights}; convert an artifact with fp32 weights")
    if artifact.vocoder_weights != "fp32":
        raise ValueError(f"{src}: its vocoder is {artifact.vocoder_weights}; convert an artifact with an fp32 vocoder")
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for role, graph in artifact.graphs.items():
        if role in NETWORK_GRAPHS:
            stats[role] = convert_file(artifact.file(role), out / graph.file)
        else:  # written as every graph is (engines/onnx_data.py), unchanged
            rewrite_file(artifact.file(role), out / graph.file, lambda model, data_dir: {})
    for name in artifact.files.values():
        if (out / name).resolve() != (src / name).resolve():
            shutil.copy(src / name, out / name)
    manifest = replace(artifact, precision="fp16").to_json()
    (out / "artifact.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return stats

