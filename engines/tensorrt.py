"""TensorRT plans for an artifact, built on the device (Jetson, TensorRT 10): `edged-engines plans`.

Writes `<graph>.plan` beside each `<graph>.onnx` the TensorRT backend loads (not the clone encoder's
speaker and codec encoders, which run on ONNX Runtime whatever the backend: `ON_ONNX_RUNTIME`),
stamped with the TensorRT version and what the graph was built from (its files' sizes and times, and
their SHA-256; `edged/backends/plan_file.py`: the backend refuses a stale plan, `verify_plans`
re-hashes on request), with the
optimization profiles of what the runtime binds (`PROFILES`): the talker is one engine (its weights
once) with a context profile (one request's prefill: 1 member, 1..max_seq rows, a one-slot cache)
and a generation profile (1..max_batch members with opt 1, one row over the max_seq cache, attending
its first 64..max_seq slots); the code predictor (one pass: 1..2 rows over its code-groups-slot
cache) and the vocoder have one profile each (batch 1..max_batch with opt 1; vocoder window
1..max(chunk_frames, first_chunk_frames) with opt chunk_frames: pass the daemon's `[vocoder]`
values). Which axis of which input is dynamic, and in what role, is that explicit table; an input
with a dynamic axis the table does not name is an error, so a contract change cannot build a plan
that the runtime's bindings fall outside of. The builder's workspace is capped (default 1 GiB, for
an 8 GB Orin). TF32 is cleared for every build: it is on by default (NvInfer.h BuilderFlag::kTF32,
"Enabled by default") and STRONGLY_TYPED does not clear it, so without this the fp32 islands of a
strongly typed plan (norms, softmax, logits, sampling) and every fp32 plan would round their products'
inputs to 10-bit mantissas. An fp16 artifact, and an int4 one in the Jetson form, is built as a
strongly typed network: its graphs say where fp16 (and INT4 weights) are and where fp32 stays. A
quantized form TensorRT 10.3 cannot build is refused first, with the reason (`weights_refusal`).
Auxiliary streams are off (`max_aux_streams = 0`, "single-stream inference"): the backend runs every
context on one stream, serially, and NvInfer.h's setMaxAuxStreams says auxiliary streams cost
activation memory that cannot be reused, which a one-stream loop never wins back. Plans keep
detailed layer information (`ProfilingVerbosity.DETAILED`), so the engine inspector shows each
layer's weights and types (scripts/validate_jetson.py checks an int4 plan's GEMMs by it). The
backend's CUDA kernels (`edged/backends/kernels.py`) are compiled for this GPU beside the plans. Only
`build` and `build_plans` need TensorRT; the profiles are computed (and tested) without it."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path

from edged.backends import kernels
from edged.backends.plan_file import verify_plan, write_plan
from edged.backends.tensorrt_version import refusal
from edged.clone.roles import ROLES as CLONE_ROLES
from edged.request import MAX_VERIFY_WINDOW as MAX_WINDOW
from engines.weight_form import FormError, form, vocoder_form

ANY = "*"
Profile = dict[str, dict[int, str]]
"""input name (an fnmatch pattern, or ANY for the rest) -> {axis: size role}."""
PROFILES: dict[str, list[Profile]] = {
    "talker": [
        {"inputs_embeds": {0: "1", 1: "T"}, "past_keys_*": {0: "1", 3: "1"}, "past_values_*": {0: "1", 2: "1"},
         "slots": {0: "1"}, ANY: {0: "1"}},  # context: a request's prefill over the one-slot cache the mask hides
        {"inputs_embeds": {0: "B", 1: "1"}, "past_keys_*": {0: "B", 3: "S"}, "past_values_*": {0: "B", 2: "S"},
         "slots": {0: "L"}, ANY: {0: "B"}},  # generation: one row per member over the first L cache slots
    ],
    "code_predictor": [{"inputs_embeds": {0: "B", 1: "R"}, "heads": {0: "V"}, "drafts": {0: "B", 1: "V"},
                        "draft_probs": {0: "B", 1: "V"}, "accept_noise": {0: "B", 1: "V"}, "noise": {0: "B", 1: "V"},
                        "past_keys_*": {0: "B", 3: "G"}, "past_values_*": {0: "B", 2: "G"},
                        ANY: {0: "B"}}],  # a pass: R new rows per member, the last V of them verified
    "code_predictor_draft": [{"heads": {0: "D"}, "noise": {0: "B", 1: "D"}, ANY: {0: "B"}}],
    "vocoder": [{"codes": {0: "B", 2: "F"}, ANY: {0: "B"}}],
}
"""graph role -> its optimization profiles. Size roles: B batch, T prefill rows, S cache slots
(max_seq), L slots a decode attends (64..max_seq), R code-predictor pass rows (1..8: 2 in a frame's
first pass, 1 + drafts after it), V rows a pass verifies (1 + drafts), D drafted groups (1..7), G
code-predictor cache slots (code groups), F vocoder frames, 1 exactly one."""
ON_ONNX_RUNTIME = CLONE_ROLES
"""Graphs that run on ONNX Runtime whatever the daemon's backend, so they get no plan: the clone
encoder (speaker and codec encoders), run by the voice thread (edged/daemon.py) and `edged synth
--ref-audio` (edged/cli/synth.py) on sessions of their own, off the TensorRT backend's CUDA context
and its shared activation block."""
WORKSPACE = 1 << 30
"""Builder workspace limit (bytes): leaves room for the weights and the KV cache on an 8 GB Orin."""
TACTIC_DRAM = 2 << 30
"""What tactic selection may claim while building (TensorRT's default is 75% of device memory, which
on an 8 GB Orin shares DRAM with the OS and the running daemon)."""


def sizes(limits: dict, code_groups: int, chunk_frames: int = 4, first_chunk_frames: int = 1) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) per size role."""
    b, s, g = limits["max_batch"], limits["max_seq"], code_groups
    window = max(chunk_frames, first_chunk_frames)
    return {"B": (1, 1, b), "T": (1, min(64, s), s), "S": (s, s, s), "L": (min(64, s), min(64, s), s),
            "R": (1, 1, max(2, min(MAX_WINDOW, g - 1))), "V": (1, 1, max(1, min(MAX_WINDOW, g - 1))),
            "D": (1, 1, max(1, min(MAX_WINDOW - 1, g - 2))), "G": (g, g, g),
            "F": (1, chunk_frames, window), "1": (1, 1, 1)}


def profiles(role: str) -> list[Profile]:
    if role not in PROFILES:
        raise ValueError(f"{role}: engines/tensorrt.py PROFILES has no entry for this graph")
    return PROFILES[role]


def profile(role: str, index: int, name: str, shape: list[int], sizes_by_role: dict[str, tuple[int, int, int]],
            ) -> tuple[list[int], list[int], list[int]] | None:
    """(min, opt, max) shapes of one input in one profile of a graph; None when it has no dynamic axis."""
    table = profiles(role)[index]
    if all(d >= 0 for d in shape):
        return None
    pattern = name if name in table else next((k for k in table if k != ANY and fnmatchcase(name, k)), ANY)
    axes = table.get(pattern, {})
    lo, opt, hi = [], [], []
    for axis, d in enumerate(shape):
        if d >= 0:
            lo.append(d), opt.append(d), hi.append(d)
            continue
        if axis not in axes:
            raise ValueError(f"{role}: input {name} axis {axis} is dynamic, but engines/tensorrt.py PROFILES names "
                             f"no size for it")
        a, b, c = sizes_by_role[axes[axis]]
        lo.append(a), opt.append(b), hi.append(c)
    return lo, opt, hi


def build(onnx_path: Path, role: str, sizes_by_role: dict[str, tuple[int, int, int]], strongly_typed: bool,
          workspace: int = WORKSPACE):
    """The serialized engine (TensorRT's IHostMemory, a buffer written out as it is)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SystemExit(f"{onnx_path.name}: ONNX parse failed: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    config.set_memory_pool_limit(trt.MemoryPoolType.TACTIC_DRAM, TACTIC_DRAM)
    config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32, strongly typed or not: plans match ONNX Runtime
    config.max_aux_streams = 0  # one stream: NvInfer.h, more "will not be able to" reuse activation memory
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the engine inspector shows each layer's weights
    for index in range(len(profiles(role))):
        optimization = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shapes = profile(role, index, tensor.name, list(tensor.shape), sizes_by_role)
            if shapes is not None:
                optimization.set_shape(tensor.name, *shapes)
        config.add_optimization_profile(optimization)
    plan = builder.build_serialized_network(network, config)
    if plan is None:  # TensorRT logged why
        raise SystemExit(f"{onnx_path.name}: TensorRT build failed (its log above says why)")
    return plan


def weights_refusal(model: dict) -> str | None:
    """Why TensorRT 10.3 cannot build an artifact's quantized weights (engines/weight_form.py), or None."""
    weights, target = model.get("weights", "fp32"), model.get("weight_target")
    if model.get("vocoder_weights", "fp32") != "fp32":
        try:
            vocoder_form(model["vocoder_weights"], "jetson")
        except FormError as exc:
            return str(exc)
    if weights == "fp32":
        return None
    try:
        form(weights, "jetson", model.get("weight_block") if target == "jetson" else None)
    except FormError as exc:
        return str(exc)
    if target != "jetson":
        return (f"its {weights} weights are in the {target} form ({model.get('weight_block')}-row blocks, fp32 "
                f"scales), and TensorRT 10.3 takes INT4 blocks of 64 or 128 rows with fp16 scales (fp32 scales make "
                f"every product an fp32 GEMM): quantize the fp32 artifact with --target jetson")
    if model.get("precision", "fp32") != "fp16":  # the form before fp16 networks: fp32 around every product
        return (f"its {weights} Jetson weights sit in an fp32 network (the earlier form); quantize the fp32 artifact "
                f"again with --target jetson")
    return None


def tensorrt_roles(manifest: dict) -> list[str]:
    """The graphs of an artifact the TensorRT backend loads: every one but the clone encoder's."""
    return [role for role in manifest["tensors"] if role not in ON_ONNX_RUNTIME]


def verify_plans(artifact: Path) -> list[tuple[Path, str | None]]:
    """Each plan of the artifact and why it is not what its graph's files hash to now (None: it is),
    re-reading every graph and its weights whole: what the boot does not do. Needs no TensorRT."""
    manifest = json.loads((artifact / "artifact.json").read_text())
    results = []
    for role in tensorrt_roles(manifest):
        onnx_path = artifact / manifest["files"][role]
        plan = onnx_path.with_suffix(".plan")
        results.append((plan, verify_plan(plan, onnx_path)))
    return results


def build_plans(artifact: Path, *, chunk_frames: int = 4, first_chunk_frames: int = 1,
                workspace: int = WORKSPACE) -> list[Path]:
    """Build a stamped plan for every graph the TensorRT backend loads (`tensorrt_roles`: not the clone
    encoder's), and the backend's kernels; returns the plans' paths. An fp16 artifact (`edged-engines
    fp16` / `export --precision fp16`) is built strongly typed: fp16 where its graphs say so, fp32
    everywhere else; so is an int4 artifact in the Jetson form
    (`quantize --target jetson`), whose DequantizeLinear weights TensorRT builds into INT4-weight fp16
    GEMMs (explicit quantization). A form it cannot build is refused before anything is built."""
    import pycuda.driver as cuda
    import tensorrt as trt

    too_old = refusal(trt.__version__)
    if too_old:
        raise SystemExit(f"edged-engines plans: {too_old}")
    manifest = json.loads((artifact / "artifact.json").read_text())
    refused = weights_refusal(manifest["model"])
    if refused:
        raise SystemExit(f"{artifact}: TensorRT 10.3 cannot build this artifact: {refused}")
    fp16 = manifest["model"].get("precision", "fp32") == "fp16"
    strongly_typed = fp16 or manifest["model"].get("weights", "fp32") != "fp32"
    by_role = sizes(manifest["limits"], manifest["dims"]["code_groups"], chunk_frames, first_chunk_frames)
    written = []
    for role in tensorrt_roles(manifest):
        onnx_path = artifact / manifest["files"][role]
        plan = onnx_path.with_suffix(".plan")
        write_plan(plan, build(onnx_path, role, by_role, strongly_typed, workspace), trt.__version__, onnx_path,
                   fp16=fp16, profile=by_role)
        written.append(plan)
    cuda.init()
    major, minor = cuda.Device(0).compute_capability()
    kernels.build(artifact, f"sm_{major}{minor}")
    return written
