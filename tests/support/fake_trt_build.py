"""The building half of the TensorRT 10.3 double (fake_trt.py is the running half and the install):
`OnnxParser` and `Builder`, which keep what `edged-engines plans` depends on and refuse what TensorRT
10.3 refuses, each rule citing where TensorRT says so.

Building (`OnnxParser`, `Builder`):
- the parser refuses an operator outside onnx-tensorrt's support table (docs/operators.md at
  release 10.1-GA; the 10.2 and 10.3 changelogs add no operator), naming it, and the nodes its
  importer refuses (`IMPORTER_RULES`, each citing onnx-tensorrt at release/10.1-GA): axes that are
  not constants, TopK unsorted or with K of 3840 or more, a Q/DQ zero point other than zero, INT4
  with an odd last dimension, a blocked scale blocking more than one dimension;
- the builder returns None, logging the error, for a dynamic input no profile covers; for a blocked
  DequantizeLinear whose weights are not INT4 (NvInfer.h IDequantizeLayer: "Block dequantization is
  supported only for 2-D input tensors with DataType::kINT4 that are rooted at an IConstantLayer");
  for INT4 blocks other than 64 or 128 rows (Working with Quantized Types); for a precision flag on
  a strongly typed network (NvInfer.h kSTRONGLY_TYPED: "Setting layer precision and layer output
  types is not allowed");
- auxiliary streams: `max_aux_streams` is -1 unless set (TensorRT picks how many); an engine built
  with any recorded them (`aux_streams`) and its activation figure is doubled: NvInfer.h
  setMaxAuxStreams, "Using more auxiliary leads to more memory usage at runtime since some
  activation memory blocks will not be able to be reused";
- it warns (TensorRT builds them) about INT4 weights with fp32 scales in a strongly typed network
  ("output data type is inferred from scale data type": an fp32 GEMM), and about fp32 products
  built with TF32 on (BuilderFlag::kTF32 "Enabled by default": their inputs are rounded to 10-bit
  mantissas); the engine keeps `tf32` and `fp32_int4_products`, so a test sees both;
- `build_serialized_network` returns an IHostMemory (a buffer: the engine's facts, then bytes that
  stand in for the weights as TensorRT keeps them, INT4 packed at half a byte, or PLAN_PADDING bytes
  when a test wants a large plan) recording, per profile, the activation memory the
  engine will ask for (`_activation_bytes`): not TensorRT's figure, but one taken from the graph's
  own intermediate tensors at the profile's largest shapes, so a block sized from it is tested
  against what the graph needs.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx
import onnxruntime as ort
from support.fake_trt import MAGIC, BuilderFlag, Logger, MemoryPoolType, NetworkDefinitionCreationFlag, ProfilingVerbosity

PLAN_PADDING = 0
"""Bytes of stand-in engine data a built plan carries (a test sets it to make a large plan)."""
SUPPORTED = frozenset((
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "BatchNormalization", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DeformConv", "DepthToSpace", "DequantizeLinear", "Div",
    "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "Gather",
    "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "GridSample", "GroupNormalization", "GRU", "HardSigmoid", "HardSwish", "Hardmax", "Identity",
    "If", "ImageScaler", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "LogSoftmax", "Loop", "LRN", "LSTM", "LpNormalization", "LpPool", "MatMul", "Max",
    "MaxPool", "Mean", "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "NonMaxSuppression",
    "NonZero", "Not", "OneHot", "Or", "Pad", "ParametricSoftplus", "Pow", "PRelu", "QuantizeLinear", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "ReverseSequence", "RNN", "RoiAlign", "Round", "ScaledTanh",
    "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
    "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
    "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor",
))
"""onnx-tensorrt docs/operators.md (release 10.1-GA), the operators marked Y."""
INT4_BLOCKS = (64, 128)



AXES_INPUTS = {"Squeeze": (1, "Squeeze axes input must be an initializer!"),  # onnxOpImporters.cpp, Squeeze
               "Unsqueeze": (1, "Axes input for unsqueeze operation should be a constant tensor."),  # Unsqueeze
               "Slice": (3, "This version of TensorRT does not support dynamic axes."),  # Slice
               "Pad": (3, "`axes` must be an initializer"),  # docs/operators.md, Pad
               "CumSum": (1, "`axis` must be an initializer"),  # docs/operators.md, CumSum
               **{op: (1, "Axis input must be an initializer!")  # importerUtils.cpp, reduceTensor
                  for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
                             "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")}}
"""op -> (the input holding its axes, the importer's words when that input is not a constant)."""
TOPK_MAX_K = 3840
"""docs/operators.md, TopK: "`sorted` must be 1. `K` input must be less than 3840."."""
IMPORTER_RULES = (
    "axes inputs are constants (an initializer or a Constant node's output): AXES_INPUTS",
    "TopK: sorted is 1 and K below 3840 (docs/operators.md)",
    "QuantizeLinear/DequantizeLinear: a constant zero point is all zeros (QuantDequantLinearHelper: \"TensorRT only "
    "supports symmetric quantization\") and has the scale's volume",
    "INT4: an even last dimension (\"Quantization to INT4 is not supported for tensors with an odd last dimension\")",
    "a blocked scale (the input's rank) blocks one dimension (\"Only a single blocking dimension is allowed.\") by an "
    "integer block (\"Inferred block size is not an integer.\")",
)
"""What onnx-tensorrt's importer refuses beyond unknown operators (onnxOpImporters.cpp, importerUtils.cpp and
docs/operators.md at release/10.1-GA; `importer_refusals`)."""


def importer_refusals(model: onnx.ModelProto) -> list[_ParserError]:
    """The nodes onnx-tensorrt's importer would refuse (IMPORTER_RULES), each with its words."""
    inits = {i.name: i for i in model.graph.initializer}
    constants = dict(inits)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t

    def value(name: str) -> np.ndarray | None:
        tensor = constants.get(name)
        if tensor is None or tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            return None
        return onnx.numpy_helper.to_array(tensor)

    errors = []
    for node in model.graph.node:
        op, given, refused = node.op_type, list(node.input), []
        if op in AXES_INPUTS:
            index, words = AXES_INPUTS[op]
            if len(given) > index and given[index] and given[index] not in constants:
                refused.append(words)
        elif op == "TopK":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            k = value(given[1]) if len(given) > 1 else None
            if attrs.get("sorted", 1) != 1:
                refused.append("TopK: `sorted` must be 1")
            if k is not None and int(np.max(k)) >= TOPK_MAX_K:
                refused.append(f"TopK: `K` input must be less than {TOPK_MAX_K}")
        elif op in ("QuantizeLinear", "DequantizeLinear"):
            refused = _qdq_refusals(node, constants, value)
        errors += [_ParserError(node.name, op, desc) for desc in refused]
    return errors


def _qdq_refusals(node: onnx.NodeProto, constants: dict, value) -> list[str]:
    scale = constants.get(node.input[1])
    data = constants.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
    zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
    refusals = []
    if zero is not None and zero in constants:
        point = constants[zero]
        if point.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            packed = np.frombuffer(point.raw_data, np.uint8) if point.raw_data else np.array(point.int32_data)
            nonzero = bool(np.any(packed))
        else:
            nonzero = bool(np.any(value(zero)))
        if nonzero:
            refusals.append("TensorRT only supports symmetric quantization. The zero point for the "
                            "QuantizeLinear/DequantizeLinear operator must be all zeros.")
        if scale is not None and int(np.prod(point.dims)) != int(np.prod(scale.dims)):
            refusals.append("The scale and zero point must have the same volume.")
    int4 = (data is not None and data.data_type == onnx.TensorProto.INT4) or (
        zero in constants and constants[zero].data_type == onnx.TensorProto.INT4)
    if data is not None and int4 and data.dims and data.dims[-1] % 2:
        refusals.append("Quantization to INT4 is not supported for tensors with an odd last dimension.")
    if data is not None and scale is not None and len(scale.dims) == len(data.dims) > 0 and \
            int(np.prod(scale.dims)) != 1:
        if sum(1 for d, s in zip(data.dims, scale.dims) if s == 0 or d // s != 1) != 1:
            refusals.append("Only a single blocking dimension is allowed.")
        elif int(np.prod(data.dims)) % int(np.prod(scale.dims)):
            refusals.append("Inferred block size is not an integer.")
    return refusals


class _Tensor:
    def __init__(self, name: str, shape: list[int]) -> None:
        self.name, self.shape = name, shape


class _Network:
    def __init__(self, flags: int = 0) -> None:
        self.strongly_typed = bool(flags & (1 << NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        self.onnx_path: str | None = None
        self.model: onnx.ModelProto | None = None
        self.inputs: list[_Tensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> _Tensor:
        return self.inputs[i]


class _ParserError:
    def __init__(self, node: str, op: str, desc: str) -> None:
        self.node_name, self.op, self._desc = node, op, desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return f"In node {self.node_name} ({self.op}): {self._desc}"


class OnnxParser:
    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.errors: list[_ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> _ParserError:
        return self.errors[i]

    def parse_from_file(self, path: str) -> bool:
        model = onnx.load(path, load_external_data=False)
        self.errors = [_ParserError(n.name, n.op_type, f"No importer registered for op: {n.op_type}")
                       for n in model.graph.node if n.op_type not in SUPPORTED]
        self.errors += importer_refusals(model)
        if self.errors:
            return False
        inits = {i.name for i in model.graph.initializer}
        self.network.onnx_path, self.network.model = path, model
        self.network.inputs = [_Tensor(i.name, [d.dim_value if d.HasField("dim_value") else -1
                                                for d in i.type.tensor_type.shape.dim])
                               for i in model.graph.input if i.name not in inits]
        return True


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[list[int], list[int], list[int]]] = {}

    def set_shape(self, name: str, lo, opt, hi) -> None:
        if not (len(lo) == len(opt) == len(hi) and all(a <= b <= c for a, b, c in zip(lo, opt, hi))):
            raise ValueError(f"invalid profile for {name}: {lo} {opt} {hi}")
        self.shapes[name] = (list(lo), list(opt), list(hi))


class _Config:
    def __init__(self) -> None:
        self.flags: set = {BuilderFlag.TF32}  # NvInfer.h BuilderFlag::kTF32: "Enabled by default."
        self.profiles: list[_Profile] = []
        self.pools: dict = {}
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY  # NvInferRuntime.h: the default
        self.max_aux_streams = -1  # TensorRT chooses; NvInfer.h setMaxAuxStreams: "Set this to 0 to enforce
        # single-stream inference"

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self.flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pools[pool] = size

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class IHostMemory(np.ndarray):
    """The serialized engine: a buffer with `nbytes` (pyFoundationalTypes.cpp: py::buffer_protocol)."""


class Builder:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        return _Network(flags)

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> IHostMemory | None:
        refused = self._refusal(network, config)
        if refused:
            self.logger.log(Logger.ERROR, refused)
            return None
        model = network.model
        assert model is not None
        fp32_int4 = _fp32_scaled_int4(model) if network.strongly_typed else 0
        if fp32_int4:
            self.logger.log(Logger.WARNING, f"{fp32_int4} INT4 weights dequantize to FLOAT (their scales' type in a "
                                            f"strongly typed network): their products run as fp32 GEMMs")
        tf32 = BuilderFlag.TF32 in config.flags
        if tf32 and any(n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") for n in model.graph.node):
            self.logger.log(Logger.WARNING, "TF32 is enabled: fp32 products may round their inputs to 10-bit mantissas")
        profiles = [p.shapes for p in config.profiles] or [{}]
        activations = _activation_bytes(network.onnx_path, profiles)
        if config.max_aux_streams != 0:  # "some activation memory blocks will not be able to be reused"
            activations = [2 * a for a in activations]
        spec = json.dumps({"onnx": network.onnx_path, "profiles": profiles, "aux_streams": config.max_aux_streams,
                           "profiling_verbosity": config.profiling_verbosity.name,
                           "activation_bytes": activations,
                           "strongly_typed": network.strongly_typed, "tf32": tf32,
                           "fp32_int4_products": fp32_int4}).encode()
        data = np.zeros(len(MAGIC) + 8 + len(spec) + (PLAN_PADDING or _weight_bytes(model)), np.uint8)
        data[:len(MAGIC) + 8 + len(spec)] = np.frombuffer(MAGIC + struct.pack("<Q", len(spec)) + spec, np.uint8)
        return data.view(IHostMemory)

    @staticmethod
    def _refusal(network: _Network, config: _Config) -> str | None:
        if network.model is None:
            return "the network has no layers (the parser failed)"
        if network.strongly_typed and config.flags & {BuilderFlag.FP16, BuilderFlag.INT8, BuilderFlag.BF16}:
            return "precision flags are not allowed in a strongly typed network"
        dynamic = [t.name for t in network.inputs if any(d < 0 for d in t.shape)]
        for i, profile in enumerate([p.shapes for p in config.profiles] or [{}]):
            missing = [n for n in dynamic if n not in profile]
            if missing:
                return f"optimization profile {i} has no shapes for dynamic inputs {missing}"
        inits = {i.name: i for i in network.model.graph.initializer}
        for node in network.model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
                continue
            weights, scale = inits[node.input[0]], inits.get(node.input[1])
            blocked = scale is not None and len(scale.dims) == 2
            block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
            if blocked and weights.data_type != onnx.TensorProto.INT4:
                return (f"{node.name}: IDequantizeLayer: block quantization is supported only for 2-D input tensors "
                        f"with DataType::kINT4")
            if weights.data_type == onnx.TensorProto.INT4 and blocked and block not in INT4_BLOCKS:
                return f"{node.name}: INT4 block size {block} is not supported (64 or 128)"
        return None


def _activation_bytes(onnx_path: str, profiles: list[dict]) -> list[int]:
    """Each profile's activation memory, in 256-byte units: the peak, over the graph's nodes in order,
    of the intermediate tensors alive at once (computed from the inputs, read by a later node, neither
    an input nor an output, which the caller binds), their sizes taken by running the graph on ONNX
    Runtime at the profile's largest shapes (zeros). TensorRT fuses and reuses more, so its figure
    differs; what matters here is that it comes from the graph, as TensorRT's does."""
    model = onnx.load(onnx_path)  # with its external data: the session below runs it
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    dynamic = {i.name for i in inputs}
    for node in graph.node:  # what depends on no input is folded into weights by TensorRT
        if any(x in dynamic for x in node.input):
            dynamic.update(o for o in node.output if o)
    outputs = {o.name for o in graph.output}
    counted = [o for n in graph.node for o in n.output if o in dynamic and o not in outputs]
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in counted)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    last_use = {x: k for k, node in enumerate(graph.node) for x in node.input if x in counted}
    sizes = []
    for profile in profiles:
        feeds = {i.name: np.zeros(profile[i.name][2] if i.name in profile else
                                  [d.dim_value for d in i.type.tensor_type.shape.dim],
                                  onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                 for i in inputs}
        values = dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds)))
        nbytes = {name: values[name].nbytes for name in counted}
        live = peak = 0
        for k, node in enumerate(graph.node):
            live += sum(nbytes.get(o, 0) for o in node.output)
            peak = max(peak, live)
            live -= sum(nbytes[x] for x in set(node.input) if last_use.get(x) == k)
            live -= sum(nbytes[o] for o in node.output if o in nbytes and o not in last_use)
        sizes.append(-(-max(peak, 1) // 256) * 256)
    return sizes


WEIGHT_BYTES = {onnx.TensorProto.INT4: 0.5, onnx.TensorProto.INT8: 1, onnx.TensorProto.FLOAT16: 2,
                onnx.TensorProto.FLOAT: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.INT32: 4}


def _weight_bytes(model: onnx.ModelProto) -> int:
    """What an engine holds of the graph's weights, in the types TensorRT keeps them (INT4 packed)."""
    return int(sum(np.prod(i.dims, dtype=np.int64) * WEIGHT_BYTES.get(i.data_type, 4) for i in model.graph.initializer))


def _fp32_scaled_int4(model: onnx.ModelProto) -> int:
    inits = {i.name: i for i in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
               and inits[n.input[0]].data_type == onnx.TensorProto.INT4
               and inits[n.input[1]].data_type == onnx.TensorProto.FLOAT)
