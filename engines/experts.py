"""Qwen3-Omni's stacked experts in smaller forms that a step still gathers, so it reads only the
experts it routes to.

The talker's MoE (engines/layers.py) gathers the U experts a call uses from each stack ([E, K, N]:
gate and up [E, H, I], down [E, I, H]) with Gather(axis 0) and multiplies its rows by them; the
stacks are about 95 % of a Qwen3-Omni talker's bytes. Their forms:

- fp16 (engines/fp16.py): the stack stored fp16, gathered, the product run in fp16 (its activation
  cast in, its result cast back to fp32) like every product of an fp16 artifact: the Jetson form,
  strongly typed for TensorRT.
- int8 (`quantize_stacks`, 8 bits): symmetric blocks of `block` rows along K, q [E, K, N] INT8 and
  scales [E, K / block, N] of `scale_dtype`, both gathered, then DequantizeLinear(axis 1,
  block_size) before the MatMul.
- int4 (4 bits): ONNX's Gather takes no INT4 tensor, so two 4-bit codes share a byte: rows k and
  k + K/2 of a column, stored + 8 ([E, K/2, N] UINT8, the first half in the low nibble); a call
  gathers the bytes, splits them (BitwiseAnd 15, BitShift 4), joins the halves (Concat on K) and
  dequantizes with zero point 8. ONNX Runtime's GatherBlockQuantized (com.microsoft) reads INT4
  itself but ran about 12x slower than these ops on this 2-core CPU (1.6 vs 19 ms for one
  projection of 6 experts at the real sizes).

TensorRT 10.3 dequantizes blocks only of 2-D INT4 constants (NvInfer.h IDequantizeLayer: "Block
dequantization is supported only for 2-D input tensors with DataType::kINT4 that are rooted at an
IConstantLayer"), never a gathered tensor, and its importer takes symmetric quantization only (a
zero point of 0) and no BitwiseAnd / BitShift; so int8 and int4 experts are ONNX Runtime (CPU)
forms, and `quantize --target jetson` refuses a graph with gathered stacks before it writes anything
(engines/quantize.py; the fp16 artifact is Qwen3-Omni's Jetson form). The block and the scales' type
are parameters; engines/quantize.py passes its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.onnx_data import read_initializer

Quantize = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""w [R, N] -> (q int8 [R, N], scales [R / block, N]): symmetric blocks of rows."""


def gathered_stacks(graph: onnx.GraphProto, types: tuple[int, ...] = (TensorProto.FLOAT,),
                    ) -> dict[str, tuple[onnx.NodeProto, onnx.TensorProto]]:
    """The stacks of gathered weights: {Gather output: (the Gather, its 3-D initializer)} for each
    Gather on axis 0 of a stack of one of `types` (fp32 by default) that nothing else reads, whose
    output only MatMuls read, as their weight (input 1)."""
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))
    stacks = {}
    for node in graph.node:
        init = inits.get(node.input[0]) if node.op_type == "Gather" else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if init is None or axis != 0 or len(init.dims) != 3 or init.data_type not in types \
                or len(readers[init.name]) != 1:
            continue
        if all(reader.op_type == "MatMul" and position == 1 for reader, position in readers.get(node.output[0], [])):
            stacks[node.output[0]] = (node, init)
    return stacks


def quantize_stacks(model: onnx.ModelProto, bits: int, block: int, quantize: Quantize,
                    scale_dtype: type = np.float32, base: Path = Path()) -> dict[str, int]:
    """Replace each gathered stack (`gathered_stacks`) of `model` by its `bits` form (above), read one
    at a time from `base` (the directory of external data); returns counts of what was done."""
    graph = model.graph
    stacks = list(gathered_stacks(graph).values())
    replaced: dict[str, list[onnx.NodeProto]] = {}
    parameters, kept = 0, 0
    for gather, init in stacks:
        e, k, n = init.dims
        if k % block or k % 2:  # like a product's weight of such rows (engines/quantize.py): kept fp32
            kept += 1
            continue
        q, scale = quantize(read_initializer(init, base).astype(np.float32).reshape(e * k, n))
        q, scale = q.reshape(e, k, n), scale.reshape(e, k // block, n).astype(scale_dtype)
        name, out, indices = init.name, gather.output[0], gather.input[1]
        tensors = [numpy_helper.from_array(scale, f"{name}__scale")]
        nodes = [helper.make_node("Gather", [f"{name}__scale", indices], [f"{out}__scale"], axis=0)]
        if bits == 8:
            tensors.append(numpy_helper.from_array(q, f"{name}__q8"))
            nodes += [helper.make_node("Gather", [f"{name}__q8", indices], [f"{out}__q8"], axis=0),
                      helper.make_node("DequantizeLinear", [f"{out}__q8", f"{out}__scale"], [out], axis=1,
                                       block_size=block)]
        else:
            codes = (q.astype(np.int16) + 8).astype(np.uint8)  # 0..15
            tensors += [numpy_helper.from_array((codes[:, :k // 2] | (codes[:, k // 2:] << 4)).astype(np.uint8),
                                                f"{name}__q4x2"),
                        numpy_helper.from_array(np.array(15, np.uint8), f"{name}__low"),
                        numpy_helper.from_array(np.array(4, np.uint8), f"{name}__shift")]
            zero = helper.make_tensor(f"{name}__zero", TensorProto.UINT8, [1], [8])
            nodes += [helper.make_node("Gather", [f"{name}__q4x2", indices], [f"{out}__q4x2"], axis=0),
                      helper.make_node("BitwiseAnd", [f"{out}__q4x2", f"{name}__low"], [f"{out}__first"]),
                      helper.make_node("BitShift", [f"{out}__q4x2", f"{name}__shift"], [f"{out}__second"],
                                       direction="RIGHT"),
                      helper.make_node("Concat", [f"{out}__first", f"{out}__second"], [f"{out}__q4"], axis=1),
                      helper.make_node("Shape", [f"{out}__scale"], [f"{out}__scale_shape"]),
                      helper.make_node("ConstantOfShape", [f"{out}__scale_shape"], [f"{out}__zero"], value=zero),
                      helper.make_node("DequantizeLinear", [f"{out}__q4", f"{out}__scale", f"{out}__zero"], [out],
                                       axis=1, block_size=block)]
        for i, node in enumerate(nodes):
            node.name = f"{out}__{i}"
        graph.initializer.remove(init)
        graph.initializer.extend(tensors)
        replaced[out] = nodes
        parameters += q.size
    nodes = [new for node in graph.node
             for new in (replaced.get(node.output[0], [node]) if node.op_type == "Gather" else [node])]
    graph.ClearField("node")
    graph.node.extend(nodes)
    counts = {"gathered stacks": len(stacks) - kept, "gathered parameters": parameters, "gathered stacks kept fp32": kept}
    return {k: v for k, v in counts.items() if v}
