"""The clone encoder of a Base artifact: reference PCM -> x-vector and codec frames.

Two graphs (docs/artifact.md): `speaker_encoder` (pcm [1, N] -> xvector [1, H]; its mel front end
is inside the graph) and `codec_encoder` (pcm [1, N] -> codes [1, T, G], one frame per
samples_per_frame samples). Their buffers are claimed at boot for the longest reference allowed;
a reference of N samples runs on views of them, bound for that length (enrolling a voice is not on
the step path, so the binding is made per reference).
"""

from __future__ import annotations

import math

import numpy as np

from edged.artifact import Artifact, ArtifactError
from edged.backends import Backend
from edged.request import ClonedVoice

ROLES = ("speaker_encoder", "codec_encoder")


class VoiceEncoder:
    def __init__(self, artifact: Artifact, backend: Backend, *, max_ms: int = 30000):
        missing = [role for role in ROLES if role not in artifact.graphs]
        if missing:
            raise ArtifactError(f"this artifact has no clone encoder ({', '.join(missing)} graph missing): export a "
                                f"Base checkpoint to clone voices")
        self.artifact = artifact
        self.backend = backend
        self.max_samples = max_ms * artifact.sample_rate // 1000
        self.speaker = backend.load(artifact.file("speaker_encoder"))
        self.codec = backend.load(artifact.file("codec_encoder"))

    def preallocate(self) -> dict[str, int]:
        a, e = self.artifact, self.backend.empty
        frames = math.ceil(self.max_samples / a.samples_per_frame)
        self.pcm = e((1, self.max_samples), self.speaker.dtype("pcm"))
        self.xvector = e((1, a.dims.hidden), self.speaker.dtype("xvector"))
        self.codes = e((1, frames, a.dims.code_groups), self.codec.dtype("codes"))
        return {"clone_encoder": self.pcm.nbytes + self.xvector.nbytes + self.codes.nbytes}

    def frames(self, samples: int) -> int:
        """Codec frames of a reference of `samples` samples."""
        return math.ceil(samples / self.artifact.samples_per_frame)

    def encode(self, pcm: np.ndarray, ref_text: str | None = None, name: str = "") -> ClonedVoice:
        """A voice from `pcm` (float32 mono at the artifact's rate, checked by `reference_pcm`):
        its x-vector, and with `ref_text` its codec frames for in-context cloning."""
        n = len(pcm)
        if not 0 < n <= self.max_samples:
            raise ValueError(f"reference has {n} samples; the encoder takes 1..{self.max_samples}")
        view = self.pcm[:, :n]
        view[0] = pcm
        self.speaker.plan({"pcm": view, "xvector": self.xvector}, repeated=False).run()
        xvector = self.xvector[0].astype(np.float32, copy=True)
        if not ref_text:
            return ClonedVoice(xvector, None, None, name)
        codes = self.codes[:, :self.frames(n)]
        self.codec.plan({"pcm": view, "codes": codes}, repeated=False).run()
        return ClonedVoice(xvector, codes[0].astype(np.int64, copy=True), ref_text, name)
