"""The int8 vocoder: the vocoder graph's convolutions as dynamically quantized 8-bit products, for
ONNX Runtime on a CPU (`edged-engines quantize --vocoder int8`).

The vocoder's time is its convolutions' arithmetic, not its weights' bytes (docs/dev/performance.md, "The
vocoder graph alone"): fp32 Conv runs near a core's fp32 peak, so only narrower arithmetic makes it
cheaper. Each dense Conv (stride 1, no padding: the causal ones read their left tail from the state)
and each upsampling ConvTranspose (kernel 2 x stride) becomes one matrix product in 8 bits:

    x [B, C, L] -> [B, L, C] -> DynamicQuantizeLinear -> uint8, scale, zero point
      Conv k, dilation d:     the k taps' shifted slices side by side   -> [B, T, k C]
      ConvTranspose stride s: frame m beside frame m - 1 (zero-point padded) -> [B, L + 1, 2 C]
    -> MatMulInteger(., int8 weight, zero point) -> Cast -> x scale * weight scale (+ bias)
    -> [B, T, N] -> [B, N, T]   (ConvTranspose: [B, L + 1, s N] -> [B, (L + 1) s, N] first)

The taps are gathered in uint8 (a quarter of fp32's bytes), and ONNX Runtime fuses the tail into
MatMulIntegerToFloat, whose uint8 x int8 kernels use VNNI where the CPU has it. Without VNNI, x86's
kernel sums pairs of products into 16 bits with saturation and the PCM is wrong. So the rewritten
graph is written beside the fp32 one twice: `vocoder_int8.onnx`, and `vocoder_uint8.onnx` with the
same values stored as uint8 (zero point 128), which ONNX Runtime multiplies with its uint8 x uint8
kernels: without VNNI they widen both sides to 16 bits (pmaddwd into 32-bit sums) and are exact.
The runtime runs the one whose products are exact and faster than fp32 on the CPU
(edged/vocoder/form.py). Weights are symmetric
int8 per output channel; activations are asymmetric uint8 with one scale per call, so a call's members
share a scale: the daemon decodes one member per call. Depthwise convs (the ConvNeXt blocks), 1-channel
outputs (the last conv) and everything else stay fp32. TensorRT 10.3 has no dynamic quantization: an
int8 vocoder is ONNX Runtime's form only (engines/tensorrt.py refuses it).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.onnx_data import read_initializer, set_nodes

__all__ = ["conv_weight", "quantize_vocoder", "transposed_weight"]

MIN_CHANNELS = 2
"""Outputs narrower than this (the last conv, to 1 channel) stay fp32: a product that thin is slower in int8."""
END = 2**62  # a Slice end past any length


def conv_weight(w: np.ndarray) -> np.ndarray:
    """Conv weight [N, C, k] -> [k C, N]: row j C + c is tap j of input channel c (the taps' slices
    are concatenated in order)."""
    n, c, k = w.shape
    return np.ascontiguousarray(w.transpose(2, 1, 0).reshape(k * c, n))


def transposed_weight(w: np.ndarray, stride: int) -> np.ndarray:
    """ConvTranspose weight [C, N, 2 s] -> [2 C, s N]: rows [0, C) multiply frame m, rows [C, 2 C)
    frame m - 1; column r N + n is sample r of the s that frame m's block gives, channel n."""
    c, n, k = w.shape
    if k != 2 * stride:
        raise ValueError(f"ConvTranspose kernel {k} is not 2 x stride {stride}")
    taps = w.reshape(c, n, 2, stride).transpose(2, 0, 3, 1)  # [2, C, s, N]: tap half, channel, r, n
    return np.ascontiguousarray(taps.reshape(2 * c, stride * n))


def quantize_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [K, N] -> int8 [K, N] in [-127, 127] and fp32 scales [N], w ~= q * scale per column."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def quantize_vocoder(model: onnx.ModelProto, data_dir: Path = Path(), unsigned: bool = False) -> dict[str, int]:
    """Rewrite `model`'s dense Conv and upsampling ConvTranspose nodes in place (module docstring);
    returns counts of what was done. `unsigned`: the weights as uint8 (the int8 values + 128, zero
    point 128), which ONNX Runtime multiplies with its uint8 x uint8 kernels: on x86 without VNNI
    they widen both sides to 16 bits (pmaddwd into 32-bit sums), exact where the uint8 x int8 ones
    saturate. The same values and PCM as the signed form (an artifact's `vocoder_uint8`)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    stats: Counter[str] = Counter()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        made = _rewrite(node, inits, data_dir, unsigned)
        if made is None:
            nodes.append(node)
            if node.op_type in ("Conv", "ConvTranspose"):
                stats[f"{node.op_type} kept fp32"] += 1
            continue
        new_inits, new_nodes, parameters = made
        graph.initializer.extend(new_inits)
        nodes.extend(new_nodes)
        stats[node.op_type] += 1
        stats["parameters"] += parameters
    set_nodes(graph, nodes)
    graph.ClearField("value_info")
    return dict(stats)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rewrite(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], data_dir: Path, unsigned: bool):
    """(initializers, nodes, parameters) replacing `node`, or None when it stays as it is."""
    if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2 or node.input[1] not in inits:
        return None
    a = _attrs(node)
    weight = inits[node.input[1]]
    if weight.data_type != TensorProto.FLOAT or len(weight.dims) != 3 or a.get("group", 1) != 1:
        return None
    if any(a.get("pads", [0, 0])) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if node.op_type == "Conv":
        if a.get("strides", [1]) != [1] or weight.dims[0] < MIN_CHANNELS:
            return None
        dilation, k = a.get("dilations", [1])[0], weight.dims[2]
        w = conv_weight(read_initializer(weight, data_dir).astype(np.float32))
        return _product(node, inits, data_dir, w, _taps(k, dilation), 1, unsigned)
    stride = a.get("strides", [1])[0]
    if (weight.dims[2] != 2 * stride or a.get("dilations", [1]) != [1] or any(a.get("output_padding", [0]))
            or weight.dims[1] < MIN_CHANNELS):
        return None
    w = transposed_weight(read_initializer(weight, data_dir).astype(np.float32), stride)
    return _product(node, inits, data_dir, w, None, stride, unsigned)


def _taps(k: int, dilation: int) -> list[tuple[int, int]]:
    """(start, end) along time of each tap's slice of a conv's input: tap j starts j d samples in and
    leaves (k - 1 - j) d off the end."""
    return [(j * dilation, -(k - 1 - j) * dilation if j < k - 1 else END) for j in range(k)]


def _product(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], data_dir: Path, w: np.ndarray,
             taps: list[tuple[int, int]] | None, stride: int, unsigned: bool):
    """The nodes of node's output = its input's columns (taps: a conv's; None: a ConvTranspose's frame
    and the one before) @ w [K, N'] in 8 bits, + bias, back to [B, N, T]."""
    name, out = node.name or node.output[0], node.output[0]
    n = w.shape[1] // stride
    q, scale = quantize_columns(w)
    stored = (q.astype(np.int16) + 128).astype(np.uint8) if unsigned else q
    made = [numpy_helper.from_array(stored, f"{name}__w8"), numpy_helper.from_array(scale, f"{name}__wscale")]
    weight_zero = []
    if unsigned:
        made.append(numpy_helper.from_array(np.array(128, np.uint8), f"{name}__wzero"))
        weight_zero = [f"{name}__wzero"]

    def const(suffix: str, value) -> str:
        if f"{name}__{suffix}" not in {i.name for i in made}:
            made.append(numpy_helper.from_array(np.asarray(value, np.int64), f"{name}__{suffix}"))
        return f"{name}__{suffix}"

    def slice_(x: str, start: int, end: int, tag: str) -> onnx.NodeProto:
        return helper.make_node("Slice", [x, const(f"{tag}_s", [start]), const(f"{tag}_e", [end]), const("axis", [1])],
                                [f"{name}__{tag}"], name=f"{name}__{tag}")

    nodes = [helper.make_node("Transpose", [node.input[0]], [f"{name}__xt"], perm=[0, 2, 1], name=f"{name}__xt"),
             helper.make_node("DynamicQuantizeLinear", [f"{name}__xt"], [f"{name}__xq", f"{name}__xs", f"{name}__xz"],
                              name=f"{name}__xq")]
    if taps is None:  # [B, L + 2, C] zero-point padded; frame m beside frame m - 1
        nodes.append(helper.make_node("Pad", [f"{name}__xq", const("pads", [0, 1, 0, 0, 1, 0]), f"{name}__xz"],
                                      [f"{name}__xp"], name=f"{name}__xp"))
        taps, source = [(1, END), (0, -1)], f"{name}__xp"
    else:
        source = f"{name}__xq"
    if taps == [(0, END)]:
        cols = source
    else:
        slices = [slice_(source, s, e, f"tap{j}") for j, (s, e) in enumerate(taps)]
        nodes += [*slices, helper.make_node("Concat", [s.output[0] for s in slices], [f"{name}__cols"], axis=-1,
                                            name=f"{name}__cols")]
        cols = f"{name}__cols"
    nodes += [helper.make_node("MatMulInteger", [cols, made[0].name, f"{name}__xz", *weight_zero], [f"{name}__yi"],
                               name=f"{name}__mm"),
              helper.make_node("Cast", [f"{name}__yi"], [f"{name}__yf"], to=TensorProto.FLOAT, name=f"{name}__cast"),
              helper.make_node("Mul", [f"{name}__xs", made[1].name], [f"{name}__scale"], name=f"{name}__scale"),
              helper.make_node("Mul", [f"{name}__yf", f"{name}__scale"], [f"{name}__y"], name=f"{name}__y")]
    y = f"{name}__y"
    if len(node.input) > 2 and node.input[2]:
        bias = read_initializer(inits[node.input[2]], data_dir).astype(np.float32)
        made.append(numpy_helper.from_array(np.tile(bias, stride), f"{name}__bias"))
        nodes.append(helper.make_node("Add", [y, made[-1].name], [f"{name}__yb"], name=f"{name}__bias"))
        y = f"{name}__yb"
    if stride > 1:  # [B, L + 1, s N] -> [B, (L + 1) s, N]
        nodes.append(helper.make_node("Reshape", [y, const("shape", [0, -1, n])], [f"{name}__yr"], name=f"{name}__yr"))
        y = f"{name}__yr"
    nodes.append(helper.make_node("Transpose", [y], [out], perm=[0, 2, 1], name=f"{name}__out"))
    return made, nodes, int(w.size)
