"""Which of an artifact's vocoder graphs runs: its fp32 `vocoder`, or one of the int8 twins that
`edged-engines quantize --vocoder int8` puts beside it (engines/vocoder_int8.py): `vocoder_int8`
(int8 weights) or `vocoder_uint8` (the same values as uint8).

An int8 twin runs only where its products are exact and faster than fp32 on ONNX Runtime's kernels:
- 8-bit dot-product instructions (VNNI, AMX, ARM's dot product): `vocoder_int8`, about half fp32's time;
- x86 without VNNI (AVX2, AVX-512 without VNNI): the uint8 x int8 kernel sums pairs of products into
  16 bits with saturation (the PCM falls to about 8-17 dB SNR), its uint8 x uint8 kernel widens to 16
  bits and is exact: `vocoder_uint8` (0.76x fp32's time on an AMD Zen 3, 0.81x with the AVX2 kernels on
  an Intel Xeon: docs/dev/performance.md), or fp32 where an artifact made before it has no such twin;
- ARM64 without the dot product, x86 without AVX2: the kernels widen to 16-bit multiplies, no faster
  than fp32: fp32.
The reason is said in the boot log and in `status.vocoder`, never silently (edged.cpu names the kernel).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edged.artifact import Artifact
from edged.artifact.manifest import VOCODER_INT8, VOCODER_UINT8
from edged.cpu import DOT, Cpu, this_cpu


@dataclass(frozen=True)
class VocoderForm:
    weights: str
    """What runs: fp32 or int8."""
    role: str
    """The artifact's graph that runs (vocoder, vocoder_int8, vocoder_uint8)."""
    why: str

    def line(self) -> str:
        return f"vocoder: {self.weights} ({self.why})"

    def to_json(self) -> dict:
        return asdict(self)


def choose_vocoder(artifact: Artifact, backend: str, cpu: Cpu | None = None) -> VocoderForm:
    """The form `backend` runs of `artifact`'s vocoder on `cpu` (this process's CPU by default)."""
    if artifact.vocoder_weights == "fp32":
        return VocoderForm("fp32", "vocoder", "the artifact's only vocoder")
    if backend != "onnxruntime":
        return VocoderForm("fp32", "vocoder", f"the int8 vocoder is ONNX Runtime's CPU form; {backend} runs the fp32 one")
    cpu = cpu or this_cpu()
    if cpu.int8_products in DOT:
        return VocoderForm("int8", VOCODER_INT8, f"{cpu.int8_products} 8-bit products on this CPU")
    if cpu.int8_saturates:
        saturate = f"this CPU's uint8 x int8 products ({cpu.int8_products}, no VNNI) saturate 16-bit sums"
        if VOCODER_UINT8 in artifact.graphs:
            return VocoderForm("int8", VOCODER_UINT8, f"uint8 weights: {saturate}, its uint8 x uint8 ones do not")
        return VocoderForm("fp32", "vocoder", f"the int8 vocoder is not run: {saturate}, and this artifact has no "
                                              f"uint8 form of it (quantize its fp32 source again)")
    return VocoderForm("fp32", "vocoder", f"the int8 vocoder is not run: this CPU has no 8-bit dot-product "
                                          f"instructions ({cpu.int8_products}), so int8 is no faster than fp32")
