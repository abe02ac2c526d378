"""Which of an artifact's vocoder graphs runs: its fp32 `vocoder`, or the `vocoder_int8` twin that
`edged-engines quantize --vocoder int8` puts beside it (engines/vocoder_int8.py).

The int8 twin runs only where its products are exact and faster than fp32: ONNX Runtime on a CPU
whose uint8 x int8 kernel has 8-bit dot-product instructions (VNNI, AMX, ARM's dot product). On x86
without VNNI the kernel sums pairs of products into 16 bits with saturation (the vocoder's PCM falls
to about 8 dB SNR; measured twice as slow as fp32 there too), and ARM64 without the dot product
widens to 16-bit multiplies, no faster than fp32: there the fp32 graph runs, and the reason is said
in the boot log and in `status.vocoder`, never silently (edged.cpu names the kernel).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edged.artifact import Artifact
from edged.cpu import DOT, Cpu, this_cpu


@dataclass(frozen=True)
class VocoderForm:
    weights: str
    """What runs: fp32 or int8."""
    role: str
    """The artifact's graph that runs (vocoder, vocoder_int8)."""
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
        return VocoderForm("int8", "vocoder_int8", f"{cpu.int8_products} 8-bit products on this CPU")
    if cpu.int8_saturates:
        return VocoderForm("fp32", "vocoder", f"the int8 vocoder is not run: this CPU's uint8 x int8 products "
                                              f"({cpu.int8_products}, no VNNI) saturate 16-bit sums")
    return VocoderForm("fp32", "vocoder", f"the int8 vocoder is not run: this CPU has no 8-bit dot-product "
                                          f"instructions ({cpu.int8_products}), so int8 is no faster than fp32")
