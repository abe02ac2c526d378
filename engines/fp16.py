"""fp16 weights with fp32 islands: a strongly typed ONNX graph for TensorRT (and ONNX Runtime).

Marking a whole network fp16 lets TensorRT run norms, softmax and the sampler in fp16: RMSNorm's
Pow/ReduceMean overflows, and the Gumbel noise log(-log(u)) is +inf for u near 1, which picks a
random token about half the time. Here instead the types are explicit in the graph: the weights of
the matrix products and convolutions become fp16, each such product reads its activation cast to
fp16 and hands its result back cast to fp32, and everything else stays fp32 (norms, softmax,
attention scores, residual sums, the heads that make logits (Gemm), the embeddings (Gather), the
sampler and its constants). TensorRT builds it with STRONGLY_TYPED and honors every cast; ONNX
Runtime runs the same graph on the CPU. Graph inputs and outputs keep their types, so the runtime's
buffers do not change.
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
from engines.onnx_data import read_initializer, save_streamed

WEIGHT_INPUTS = {"MatMul": (1,), "Conv": (1, 2), "ConvTranspose": (1, 2)}
"""Node types whose constant inputs (by position) become fp16: the weight, and the bias of a conv."""
CONSTANTS = "lifted_tensor"
"""Constants the exporter lifted from the code (the sampler's triangular matrix): never weights."""


def to_fp16(model: onnx.ModelProto, base: Path = Path()) -> onnx.ModelProto:
    """The model with fp16 weights and explicit casts around every product that uses them (`base`:
    the directory of its external data, read one tensor at a time)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    stacks = gathered_stacks(graph)  # Qwen3-Omni's experts: stored fp16, gathered, multiplied in fp16

    def convertible(node: onnx.NodeProto) -> bool:
        if node.op_type == "MatMul" and node.input[1] in stacks:
            return True
        positions = WEIGHT_INPUTS.get(node.op_type, ())
        weight = node.input[positions[0]] if positions and len(node.input) > positions[0] else ""
        init = inits.get(weight)
        return init is not None and init.data_type == TensorProto.FLOAT and len(init.dims) >= 2 \
            and not weight.startswith(CONSTANTS)

    uses = Counter(name for node in graph.node for name in node.input)
    fp16_uses = Counter(node.input[i] for node in graph.node if convertible(node)
                        for i in WEIGHT_INPUTS[node.op_type] if i < len(node.input))
    converted: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if not convertible(node):
            nodes.append(node)
            continue
        stack = stacks.get(node.input[1]) if node.op_type == "MatMul" else None
        if stack is not None:
            if stack[1].name not in converted:
                _convert(graph, stack[1], converted, False, base)  # in place: the Gather's output is fp16
        else:
            for i in WEIGHT_INPUTS[node.op_type]:
                if i < len(node.input) and node.input[i]:
                    node.input[i] = converted.get(node.input[i]) or _convert(
                        graph, inits[node.input[i]], converted, uses[node.input[i]] > fp16_uses[node.input[i]], base)
        activation = node.input[0]
        nodes.append(helper.make_node("Cast", [activation], [f"{activation}__fp16_{node.name}"], to=TensorProto.FLOAT16,
                                      name=f"{node.name}__cast_in"))
        node.input[0] = f"{activation}__fp16_{node.name}"
        output = node.output[0]
        node.output[0] = f"{output}__fp16"
        nodes.append(node)
        nodes.append(helper.make_node("Cast", [node.output[0]], [output], to=TensorProto.FLOAT, name=f"{node.name}__cast_out"))
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.ClearField("value_info")  # intermediate types changed; runtimes infer them again
    return model


def _convert(graph: onnx.GraphProto, init: onnx.TensorProto, converted: dict[str, str], shared: bool,
             base: Path) -> str:
    """The fp16 twin of an fp32 initializer (in place, unless fp32 uses of it remain)."""
    half = numpy_helper.from_array(read_initializer(init, base).astype(np.float16),
                                   f"{init.name}__fp16" if shared else init.name)
    if shared:
        graph.initializer.append(half)
    else:
        init.CopyFrom(half)
    converted[init.name] = half.name
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
    if artifact.vocoder_weights != "fp32":
        raise ValueError(f"{src}: its vocoder is {artifact.vocoder_weights}; convert an artifact with an fp32 vocoder")
    out.mkdir(parents=True, exist_ok=True)
    stats = {role: convert_file(artifact.file(role), out / graph.file) for role, graph in artifact.graphs.items()}
    for name in artifact.files.values():
        if (out / name).resolve() != (src / name).resolve():
            shutil.copy(src / name, out / name)
    manifest = replace(artifact, precision="fp16").to_json()
    (out / "artifact.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return stats
