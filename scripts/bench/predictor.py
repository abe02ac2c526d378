#!/usr/bin/env python3
"""The code predictor's pass alone at the real Qwen3-TTS 0.6B dimensions, int4 and int8: where its
time goes, and what six other ways of running it would save.

    python scripts/bench/predictor.py [--repeats 9] [--calls 30] [--work DIR]

The random real-dimension checkpoint's fp32 artifact and its int8 / int4 twins (the default 128-row
blocks) come from scripts/bench/common.py's cache in `--work`, as scripts/bench/synth.py makes them.
Every session is made with the daemon's ONNX Runtime options (OrtBackend.session_options), at one
thread unless said, and fed one member's pass (batch 1, greedy, 12 cache slots valid) with a
different one of 15 heads each call, as a frame's passes read them. Each way is timed `--calls`
calls at a time, all ways in turn, round after round (drift on a shared machine hits them alike):
ms per call, the median of `--repeats` rounds after a warm-up round. The ways:

- the pass: 1 new row, 1 verified (a plain step: 15 make a frame), and 4 rows, 4 verified (verify 4);
- its products alone: the pass graph's own quantized matrix products and nothing else;
- products that share an input fused: q/k/v and gate/up as one product each, split after (the fp32
  graph rewritten, then quantized as `edged-engines quantize` does);
- two threads, ONNX Runtime's spinning off (as the daemon runs them) and on;
- the heads in int8 (per column), read through MatMulInteger with each row of the hidden quantized
  to int8 (per row, so a member's codes never depend on the others'): the one stock ONNX Runtime
  product whose integer weights can be a bound input, as the heads are;
- each head a constant in the pass's own weight form (int4 / int8 blocks, MatMulNBits): a graph per
  group, each call the group's graph, as a frame's passes would run 15 of them. The bound head is
  what lets one graph serve every group; this way shows what a constant head would save, though
  15 sessions hold 15 copies of the pass's weights (a design would share them);
- the pass cut before its head's product: one body graph (the pass up to the head's input, the K/V
  rows), then the group's head graph (its head a constant in the pass's weight form, and the
  sampler), so the 15 groups share the body's weights.

Then one plain pass profiled by node: the products, the head (the bound fp32 `heads` through a
MatMul) and everything else.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from common import parser, profiled, real_case, step_feed, variant

FORMS = ("int4", "int8")
HEADS = 15


def feeds(graph: Path, rows: int, verified: int) -> list[dict[str, np.ndarray]]:
    """One feed per head: a member's pass of `rows` new rows, `verified` verified, over 16 slots."""
    base = step_feed(graph, {"B": 1, "T": rows, "V": verified, "P": 16}, 12)
    _, hc, vc = base["heads"].shape
    heads = np.random.default_rng(1).standard_normal((HEADS + verified - 1, hc, vc), dtype=np.float32) * 0.02
    return [{**base, "heads": heads[g:g + verified]} for g in range(HEADS)]


def products_alone(graph: Path, out: Path, rows: int = 1) -> tuple[int, int]:
    """A graph of `graph`'s weight products only (each quantized weight's DequantizeLinear and its
    MatMul, or a MatMul of an fp32 weight: not the sampler's constants), each fed `rows` rows from an
    input of its own width; returns how many, and the bytes of their weights (values and scales)."""
    import onnx
    from onnx import TensorProto, helper

    from engines.quantize import CONSTANTS

    model = onnx.load(str(graph))
    g = model.graph
    made = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    inits = {i.name: i for i in g.initializer}
    nodes, inputs, outputs, used = [], {}, [], set()
    for n in g.node:
        if n.op_type != "MatMul" or n.input[1].startswith(CONSTANTS) or \
                (n.input[1] not in made and n.input[1] not in inits):
            continue
        dq = made.get(n.input[1])
        k, cols = inits[dq.input[0] if dq else n.input[1]].dims
        x = inputs.setdefault(k, helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, rows, k])).name
        nodes += [*([dq] if dq else []), helper.make_node("MatMul", [x, n.input[1]], [n.output[0]], name=n.name)]
        outputs.append(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, [1, rows, cols]))
        used.update(dq.input if dq else [n.input[1]])
    kept = [i for i in g.initializer if i.name in used]
    alone = helper.make_graph(nodes, "products", list(inputs.values()), outputs, kept)
    onnx.save(helper.make_model(alone, opset_imports=model.opset_import, ir_version=model.ir_version), str(out),
              save_as_external_data=True, location=out.name + ".data")
    return len(outputs), sum(stored_bytes(i) for i in kept)


def stored_bytes(tensor) -> int:
    """Bytes of an initializer as stored (INT4: two to a byte)."""
    from onnx import TensorProto, helper

    n = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (n + 1) // 2
    return n * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def fuse_shared(graph: Path, out: Path) -> None:
    """`graph` (fp32) with the MatMuls over constant weights that read one input (q, k, v; gate, up)
    made one MatMul over the weights side by side, split after: the same columns."""
    import onnx
    from onnx import helper, numpy_helper

    from engines.onnx_data import read_initializer, save_streamed
    from engines.quantize import set_nodes

    model = onnx.load(str(graph), load_external_data=False)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    readers = defaultdict(list)
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            readers[n.input[0]].append(n)
    swap: dict[str, list] = {}
    for x, group in readers.items():
        if len(group) < 2:
            continue
        w = [read_initializer(inits[n.input[1]], graph.parent) for n in group]
        name = "+".join(n.input[1] for n in group)
        sizes = numpy_helper.from_array(np.array([a.shape[1] for a in w], np.int64), f"{name}__split")
        g.initializer.extend([numpy_helper.from_array(np.concatenate(w, axis=1), name), sizes])
        swap[group[0].name] = [helper.make_node("MatMul", [x, name], [f"{name}__out"], name=f"{name}__mm"),
                               helper.make_node("Split", [f"{name}__out", sizes.name], [n.output[0] for n in group],
                                                axis=-1, name=f"{name}__split")]
        swap.update({n.name: [] for n in group[1:]})
    set_nodes(g, [m for n in g.node for m in swap.get(n.name, [n])])
    save_streamed(model, out, graph.parent)


def int8_heads(graph: Path, out: Path) -> None:
    """`graph` with its `heads` input int8 and a `head_scales` input [V, 1, Vc]: logits = (q(h) @
    heads) * scale(h) * head_scales, h quantized per row, symmetric."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from engines.quantize import set_nodes

    model = onnx.load(str(graph))
    g = model.graph
    heads = next(i for i in g.input if i.name == "heads")
    heads.type.tensor_type.elem_type = TensorProto.INT8
    v, _, vc = (d.dim_param or d.dim_value for d in heads.type.tensor_type.shape.dim)
    g.input.append(helper.make_tensor_value_info("head_scales", TensorProto.FLOAT, [v, 1, vc]))
    product = next(n for n in g.node if n.op_type == "MatMul" and n.input[1] == "heads")
    x, p = product.input[0], "int8_heads/"
    g.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), p + "axis"),
                          numpy_helper.from_array(np.array(1 / 127, np.float32), p + "step"),
                          numpy_helper.from_array(np.array(1e-30, np.float32), p + "tiny")])
    made = [helper.make_node("Abs", [x], [p + "abs"]),
            helper.make_node("ReduceMax", [p + "abs", p + "axis"], [p + "max"], keepdims=1),
            helper.make_node("Max", [p + "max", p + "tiny"], [p + "top"]),
            helper.make_node("Mul", [p + "top", p + "step"], [p + "scale"]),
            helper.make_node("Div", [x, p + "scale"], [p + "ratio"]),
            helper.make_node("Round", [p + "ratio"], [p + "round"]),
            helper.make_node("Cast", [p + "round"], [p + "q"], to=TensorProto.INT8),
            helper.make_node("MatMulInteger", [p + "q", "heads"], [p + "int"]),
            helper.make_node("Cast", [p + "int"], [p + "float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [p + "float", p + "scale"], [p + "rows"]),
            helper.make_node("Mul", [p + "rows", "head_scales"], [product.output[0]])]
    set_nodes(g, [m for n in g.node for m in (made if n is product else [n])])
    onnx.save(model, str(out))


def constant_heads(graph: Path, scratch: Path, heads: np.ndarray, weight_form, name: str) -> list[Path]:
    """One graph per head of `heads` [G, Hc, Vc]: `graph` with its bound `heads` input replaced by
    that head as a constant in `weight_form` (what engines.quantize makes of a weight), saved in
    `scratch` as NAME-headG.onnx."""
    import onnx

    from engines.quantize import set_nodes

    made = []
    for g, head in enumerate(heads):
        model = onnx.load(str(graph))
        gr = model.graph
        product = next(n for n in gr.node if n.op_type == "MatMul" and n.input[1] == "heads")
        inits, nodes = weight_form.product(product.input[0], f"head{g}", head, product.output[0], product.name)
        gr.initializer.extend(inits)
        set_nodes(gr, [m for n in gr.node for m in (nodes if n is product else [n])])
        kept = [i for i in gr.input if i.name != "heads"]
        del gr.input[:]
        gr.input.extend(kept)
        for opset in model.opset_import:
            if opset.domain in ("", "ai.onnx"):
                opset.version = max(opset.version, 21)  # blocked DequantizeLinear
        made.append(scratch / f"{name}-head{g}.onnx")
        onnx.save(model, str(made[-1]), save_as_external_data=True, location=made[-1].name + ".data")
    return made


def split_heads(graph: Path, scratch: Path, heads: np.ndarray, weight_form) -> tuple[Path, str, list[Path]]:
    """`graph` cut at its head's product: a body graph (the pass up to the head's input, the hidden
    and the new K/V rows) and per head of `heads` [G, Hc, Vc] a head graph (the head, a constant in
    `weight_form`, and the sampler, from the body's output to the codes); returns (body, the cut
    tensor's name, heads)."""
    import onnx
    from onnx import utils

    g = onnx.load(str(graph), load_external_data=False).graph
    cut = next(n for n in g.node if n.op_type == "MatMul" and n.input[1] == "heads").input[0]
    body, head = scratch / f"body-{graph.parent.name}.onnx", scratch / f"head-{graph.parent.name}.onnx"
    rows = [o.name for o in g.output if o.name.startswith("new_")]
    utils.extract_model(str(graph), str(body), [i.name for i in g.input if i.name != "heads"], [cut, "hidden", *rows],
                        check_model=False)
    drawn = [i.name for i in g.input if i.name in ("drafts", "draft_probs", "temperature", "top_k", "top_p",
                                                       "accept_noise", "noise")]
    utils.extract_model(str(graph), str(head), [cut, "heads", *drawn], ["codes", "accepted"], check_model=False)
    return body, cut, constant_heads(head, scratch, heads, weight_form, f"cut-{graph.parent.name}")


def with_int8_heads(fs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The same feeds with the heads as int8 codes and per-column scales."""
    out = []
    for f in fs:
        scale = np.maximum(np.abs(f["heads"]).max(axis=1, keepdims=True), 1e-30) / 127
        out.append({**f, "heads": np.round(f["heads"] / scale).astype(np.int8), "head_scales": scale})
    return out


def session(graph: Path, threads: int = 1, spinning: bool = False, accuracy: str | None = None):
    """A session with the daemon's options at `threads`; `accuracy`: MatMulNBits' accuracy level
    instead of the daemon's (edged.backends.onnxruntime.ACCURACY_LEVEL)."""
    import onnxruntime as ort

    from edged.backends.onnxruntime import OrtBackend

    ort.set_default_logger_severity(3)  # not the warning that the spinning entry is set again
    opts = OrtBackend(threads).session_options()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if accuracy is not None:
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", accuracy)
    return ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])


def where_it_goes(graph: Path) -> dict[str, tuple[float, int]]:
    """ms and nodes per call of one profiled plain pass: products, the head, the rest."""
    import onnx

    head = next(n.name for n in onnx.load(str(graph), load_external_data=False).graph.node
                if n.op_type == "MatMul" and "heads" in n.input)
    parts: dict[str, list[float]] = defaultdict(list)
    for node, op, ms in profiled(graph, 1, feeds(graph, 1, 1)[0]):
        part = "products" if op == "MatMulNBits" else "head" if node.split("/")[0] == head else "the rest"
        parts[part].append(ms)
    return {part: (sum(ms), len(ms)) for part, ms in parts.items()}


def calls_of(sessions, fs: list[dict[str, np.ndarray]]) -> Callable[[int], object]:
    """Call c of a way: its session (of a graph per group: the call's group's) on feed c."""
    ss = sessions if isinstance(sessions, list) else [sessions]
    return lambda c: ss[c % len(ss)].run(None, fs[c % len(fs)])


def split_calls(body: Path, cut: str, heads: list[Path], fs: list[dict[str, np.ndarray]]) -> Callable[[int], object]:
    """Call c of the cut pass: the body on feed c, then the call's group's head graph on its output."""
    b, hs = session(body), [session(h) for h in heads]
    body_in = {i.name for i in b.get_inputs()}
    head_in = [{i.name for i in h.get_inputs()} - {cut} for h in hs]

    def call(c: int) -> object:
        g, f = c % len(hs), fs[c % len(fs)]
        x = b.run([cut], {k: v for k, v in f.items() if k in body_in})[0]
        return hs[g].run(None, {cut: x, **{k: f[k] for k in head_in[g]}})

    return call


def measure(case, scratch: Path, repeats: int, calls: int) -> None:
    """Make the ways in `scratch`, time them and print the tables."""
    from edged.artifact import load_artifact
    from engines.quantize import quantize_file
    from engines.weight_form import form

    fused_fp32 = scratch / "fused.onnx"
    fuse_shared(case.artifact / "code_predictor.onnx", fused_fp32)
    ways: dict[tuple[str, str], Callable[[int], object]] = {}
    parts = {}
    for weights in FORMS:
        art, _ = variant(case, weights)
        graph = art / "code_predictor.onnx"
        block = load_artifact(art).weight_block
        weight_form = form(weights, "cpu", block)
        quantize_file(fused_fp32, scratch / f"fused-{weights}.onnx", weight_form)
        products, _ = products_alone(graph, scratch / f"products-{weights}.onnx")
        alone = session(scratch / f"products-{weights}.onnx")
        int8_heads(graph, scratch / f"heads-{weights}.onnx")
        plain = feeds(graph, 1, 1)
        heads = np.stack([f["heads"][0] for f in plain])
        headless = [{k: v for k, v in f.items() if k != "heads"} for f in plain]
        ways |= {(weights, "pass, 1 row"): calls_of(session(graph), plain),
                 (weights, "pass, 4 rows verified (verify 4)"): calls_of(session(graph), feeds(graph, 4, 4)),
                 (weights, f"its {products} products alone"): calls_of(alone, [{
                     i.name: np.ones([1, 1, i.shape[2]], np.float32) for i in alone.get_inputs()}]),
                 (weights, "pass, q/k/v and gate/up fused"): calls_of(session(scratch / f"fused-{weights}.onnx"), plain),
                 (weights, "pass, 2 threads"): calls_of(session(graph, 2), plain),
                 (weights, "pass, 2 threads spinning"): calls_of(session(graph, 2, True), plain),
                 (weights, "pass, int8 heads (MatMulInteger)"): calls_of(session(scratch / f"heads-{weights}.onnx"),
                                                                       with_int8_heads(plain)),
                 (weights, "pass, its head a constant (a graph per group)"): calls_of(
                     [session(g) for g in constant_heads(graph, scratch, heads, weight_form, f"pass-{weights}")],
                     headless),
                 (weights, "pass cut before its head, then the group's head graph (a constant)"): split_calls(
                     *split_heads(graph, scratch, heads, weight_form), headless)}
        parts[weights] = where_it_goes(graph)
    spent: dict[tuple[str, str], list[float]] = {way: [] for way in ways}
    for _ in range(repeats + 1):  # the first round warms up
        for way, call in ways.items():
            t0 = time.perf_counter()
            for c in range(calls):
                call(c)
            spent[way].append((time.perf_counter() - t0) * 1e3 / calls)
    print(f"\nms per call, median of {repeats} interleaved rounds of {calls} calls\n")
    print("| weights | way | ms | x the pass |\n|---|---|---|---|")
    for (weights, way), ms in spent.items():
        median = float(np.median(ms[1:]))
        plain = float(np.median(spent[(weights, "pass, 1 row")][1:]))
        print(f"| {weights} | {way} | {median:.2f} | {median / plain:.2f} |")
    print("\none plain pass profiled (kernel time; profiling adds its own)\n")
    print("| weights | part | ms | nodes |\n|---|---|---|---|")
    for weights, split in parts.items():
        for part, (ms, n) in split.items():
            print(f"| {weights} | {part} | {ms:.2f} | {n} |")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=9)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args(argv)
    case = real_case(args.work)
    with tempfile.TemporaryDirectory(prefix="edged-predictor-") as scratch:
        measure(case, Path(scratch), args.repeats, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
