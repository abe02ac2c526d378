"""The step core: the talker and the vocoder over one codec port. The daemon's loop, `edged synth`,
the warm-up and the benchmarks drive it the same way: prepare requests into slots, then `step()`."""

from edged.core.port import CodecPort
from edged.core.step import Core, StepOutput
from edged.talker.stage import Member, Outcome
from edged.vocoder.stage import Window

__all__ = ["CodecPort", "Core", "Member", "Outcome", "StepOutput", "Window"]
