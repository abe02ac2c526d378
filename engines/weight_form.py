"""How a quantized matrix weight is stored for the kernels that will read it: `WeightForm`.

A form is symmetric integers (INT8 or INT4, two per byte) in blocks of `block` rows along K, the
product's inner axis, one scale per block and column, behind `DequantizeLinear(q, scale, axis=0,
block_size)` before a MatMul. What the form must be depends on the backend that builds the graph:

- `cpu` (ONNX Runtime): each DequantizeLinear + MatMul is fused into `MatMulNBits`, which takes
  INT8 or INT4, fp32 scales and any power-of-two block of at least 16 rows.
- `jetson` (TensorRT 10.3): INT4 only, in blocks of 64 or 128 rows, and fp16 scales, in an fp16
  network (engines/fp16.py: fp16 activations and KV cache), so the DequantizeLinear's fp16 output
  feeds the fp16 product directly, with no cast. NvInfer.h (v10.3.0, IDequantizeLayer): "Block
  dequantization is supported only for 2-D input tensors with DataType::kINT4 that are rooted at an
  IConstantLayer", and "For strongly typed networks, output data type is inferred from scale data
  type": fp32 scales would make every product an fp32 (TF32) GEMM, fp16 scales an INT4-weight fp16
  one over the network's fp16 activations (NVIDIA's Model-Optimizer INT4 flow casts its scales to
  the model's type the same way). The importer takes symmetric quantization only: no zero point.
  The "Working with Quantized Types" guide: weight-only quantization is INT4's, in blocks of 64 or
  128; INT8 is quantized together with its activations, so an int8 artifact has no Jetson form.

`form(weights, target, block)` is the one place these rules live: the quantizer asks it what to
write, `edged-engines plans` asks it whether an artifact's form can be built (without onnx).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

TARGETS = ("cpu", "jetson")
BITS = {"int8": 8, "int4": 4}
CPU_BLOCKS = (128, 64, 32, 16)
"""The CPU form's default block: the first of these that divides every quantizable weight's K (128 on
every published Qwen3-TTS and Qwen3-Omni size; docs/artifact.md "8- and 4-bit weights" says why)."""
JETSON_BLOCKS = (64, 128)
JETSON_BLOCK = 128


class FormError(ValueError):
    """A form that the target's kernels cannot run; the message says which rule."""


@dataclass(frozen=True)
class WeightForm:
    target: str
    weights: str
    """int8 or int4."""
    block: int
    """Rows of a column (along K) that share a scale."""

    @property
    def bits(self) -> int:
        return BITS[self.weights]

    @property
    def half(self) -> bool:
        """fp16 weights and scales in an fp16 network (engines/fp16.py): the DequantizeLinear's fp16
        output feeds the fp16 product directly."""
        return self.target == "jetson"

    def fits(self, k: int) -> bool:
        """Whether a weight with K rows can take this form."""
        return k % self.block == 0

    def quantize(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """w [K, N] -> q int8 [K, N] in [-2^(b-1), 2^(b-1) - 1], scales [K / block, N] (fp16 for the
        half form), with w ~= q * scale per block."""
        q, scale = quantize_block(w, self.bits, self.block)
        if self.half:  # the stored scale is what dequantizes: round it first, then q against it
            scale = np.maximum(scale, np.finfo(np.float16).tiny).astype(np.float16)
            q = _round(w, scale.astype(np.float32), self.bits, self.block)
        return q, scale

    def product(self, x: str, weight: str, w: np.ndarray, out: str, name: str,
                ) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
        """out = x @ w [K, N] with w stored in this form (x fp32 for cpu, fp16 for jetson): its
        initializers and nodes."""
        from onnx import TensorProto, helper, numpy_helper

        q, scale = self.quantize(w)
        kind = TensorProto.INT8 if self.bits == 8 else TensorProto.INT4
        inits = [_integers(f"{weight}__q{self.bits}", q, kind), numpy_helper.from_array(scale, f"{weight}__scale")]
        dq = helper.make_node("DequantizeLinear", [inits[0].name, inits[1].name], [f"{weight}__dq"], axis=0,
                              block_size=self.block, name=f"{weight}__dq")
        return inits, [dq, helper.make_node("MatMul", [x, dq.output[0]], [out], name=name)]


def cpu_block(rows) -> int:
    """The CPU form's default block for weights of these K: the largest of CPU_BLOCKS that divides
    each K a block can divide (a K not a multiple of 16 stays fp32 whatever the block)."""
    ks = [k for k in rows if k % CPU_BLOCKS[-1] == 0]
    return next(b for b in CPU_BLOCKS if all(k % b == 0 for k in ks))


def form(weights: str, target: str, block: int | None = None) -> WeightForm:
    """The form of int8 / int4 weights for `target` (its default block when None: for cpu the
    largest, which engines.quantize narrows to what an artifact's weights take, `cpu_block`), or
    FormError naming the rule it breaks."""
    if weights not in BITS:
        raise FormError(f"weights must be one of {', '.join(BITS)}, got {weights!r}")
    if target not in TARGETS:
        raise FormError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if target == "jetson":
        if weights != "int4":
            raise FormError("int8 has no Jetson form: TensorRT 10.3 runs weight-only quantization for INT4 only and "
                            "refuses a blocked INT8 DequantizeLinear (block quantization is INT4-only); quantize "
                            "with --weights int4 --target jetson")
        block = JETSON_BLOCK if block is None else block
        if block not in JETSON_BLOCKS:
            raise FormError(f"block {block}: TensorRT 10.3's INT4 weight-only blocks are "
                            f"{' or '.join(map(str, JETSON_BLOCKS))} rows")
        return WeightForm(target, weights, block)
    block = CPU_BLOCKS[0] if block is None else block
    if block < 16 or block & (block - 1):
        raise FormError(f"block {block}: ONNX Runtime's MatMulNBits takes a power of two of at least 16 rows")
    return WeightForm(target, weights, block)


def vocoder_form(vocoder: str, target: str) -> str:
    """The vocoder's int8 form for `target`, or FormError naming the rule it breaks."""
    if vocoder != "int8":
        raise FormError(f"vocoder must be int8, got {vocoder!r}")
    if target != "cpu":
        raise FormError("the int8 vocoder has no Jetson form: its activations are quantized per call "
                        "(DynamicQuantizeLinear, MatMulInteger), which TensorRT 10.3 does not build (it takes "
                        "Q/DQ with constant scales); quantize the vocoder with --target cpu, or leave it fp32")
    return vocoder


def quantize_block(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric block quantization of w [K, N] along K: q int8 [K, N] in [-2^(b-1), 2^(b-1) - 1] and
    fp32 scales [K / block, N] with w ~= q * scale (per block)."""
    k, n = w.shape
    qmax = 2 ** (bits - 1) - 1
    scale = np.abs(w.reshape(k // block, block, n)).max(axis=1) / qmax
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return _round(w, scale, bits, block), scale


def dequantize(q: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    k, n = q.shape
    return (q.reshape(k // block, block, n).astype(np.float32) * scale.astype(np.float32)[:, None, :]).reshape(k, n)


def _round(w: np.ndarray, scale: np.ndarray, bits: int, block: int) -> np.ndarray:
    k, n = w.shape
    qmax = 2 ** (bits - 1) - 1
    q = np.clip(np.rint(w.reshape(k // block, block, n) / scale[:, None, :]), -qmax - 1, qmax)
    return q.astype(np.int8).reshape(k, n)


def _integers(name: str, q: np.ndarray, kind: int) -> onnx.TensorProto:
    """INT8 as bytes, INT4 two per byte (low nibble first)."""
    from onnx import TensorProto, helper

    if kind == TensorProto.INT8:
        return helper.make_tensor(name, kind, q.shape, q.tobytes(), raw=True)
    nibbles = q.reshape(-1).astype(np.uint8) & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return helper.make_tensor(name, kind, q.shape, (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes(), raw=True)
