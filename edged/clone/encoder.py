"""The clone encoder of a Base artifact: reference PCM -> x-vector and codec frames.

Two graphs (docs/artifact.md): `speaker_encoder` (pcm [1, N] -> xvector [1, H]; its mel front end
is inside the graph) and `codec_encoder` (pcm [1, N] -> codes [1, T, G], one frame per
samples_per_frame samples). Their buffers are claimed at boot for the longest reference allowed;
a reference of N samples runs on views of them, bound for that length (enrolling a voice is not on
the step path, so the binding is made per reference).

An in-context voice also gets its vocoder state primed here, on a vocoder stream of the encoder's
own: the reference's frames decoded once, so that a reply in the voice copies that state in at
admission instead of decoding them on the cohort loop (30 s of reference is 375 frames).
"""

from __future__ import annotations

import math

import numpy as np

from edged.artifact import Artifact, ArtifactError
from edged.backends import Backend
from edged.clone.roles import ROLES, can_clone
from edged.request import ClonedVoice
from edged.vocoder.form import choose_vocoder

PRIME_WINDOW = 4
"""Frames per vocoder run when priming (any window gives the same state: the vocoder streams)."""


class VoiceEncoder:
    def __init__(self, artifact: Artifact, backend: Backend, *, max_ms: int = 30000):
        if not can_clone(artifact.graphs):
            missing = [role for role in ROLES if role not in artifact.graphs]
            raise ArtifactError(f"this artifact has no clone encoder ({', '.join(missing)} graph missing): export a "
                                f"Base checkpoint to clone voices")
        self.artifact = artifact
        self.backend = backend
        self.max_samples = max_ms * artifact.sample_rate // 1000
        self.speaker = backend.load(artifact.file("speaker_encoder"))
        self.codec = backend.load(artifact.file("codec_encoder"))
        self.vocoder = backend.load(artifact.file(choose_vocoder(artifact, backend.name).role))  # the stage's form

    def preallocate(self) -> dict[str, int]:
        a, e = self.artifact, self.backend.empty
        frames = math.ceil(self.max_samples / a.samples_per_frame)
        self.pcm = e((1, self.max_samples), self.speaker.dtype("pcm"))
        self.xvector = e((1, a.dims.hidden), self.speaker.dtype("xvector"))
        self.codes = e((1, frames, a.dims.code_groups), self.codec.dtype("codes"))
        # one vocoder stream of its own, to prime an in-context voice's state once (`prime`)
        g, w, spf, dt = a.dims.code_groups, PRIME_WINDOW, a.samples_per_frame, self.vocoder.dtype
        specs = a.graphs["vocoder"].state
        self.window = e((g * w,), dt("codes"))
        self.start = e((1,), dt("start"))
        self.window_pcm = e((1, w * spf), dt("pcm"))
        self.states = [[e((1, *s.shape), dt(s.input)) for s in specs] for _ in range(2)]
        self.plans = {(side, f): self.vocoder.plan({
            "codes": self.window[:g * f].reshape(1, g, f), "start": self.start, "pcm": self.window_pcm[:, :f * spf],
            **{s.input: self.states[side][k] for k, s in enumerate(specs)},
            **{s.output: self.states[1 - side][k] for k, s in enumerate(specs)}})
            for side in (0, 1) for f in range(1, w + 1)}
        vocoder = sum(x.nbytes for x in (self.window, self.start, self.window_pcm, *self.states[0], *self.states[1]))
        return {"clone_encoder": self.pcm.nbytes + self.xvector.nbytes + self.codes.nbytes + vocoder}

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
        try:
            self.speaker.plan({"pcm": view, "xvector": self.xvector}, repeated=False).run()
            xvector = self.xvector[0].astype(np.float32, copy=True)
            if not ref_text:
                return ClonedVoice(xvector, None, None, name)
            codes = self.codes[:, :self.frames(n)]
            self.codec.plan({"pcm": view, "codes": codes}, repeated=False).run()
        finally:
            view[...] = 0  # the recording is not kept once encoded
        ref_codes = codes[0].astype(np.int64, copy=True)
        return ClonedVoice(xvector, ref_codes, ref_text, name, self.prime(ref_codes))

    def prime(self, ref_codes: np.ndarray) -> tuple[np.ndarray, ...]:
        """The vocoder's state after decoding `ref_codes` [T, G] from the start of a stream (its
        audio is not kept): what a reply in this voice starts from (VocoderStage.prepare)."""
        g = self.artifact.dims.code_groups
        for state in self.states[0]:
            self.backend.zero(state)
        side = 0
        for first in range(0, len(ref_codes), PRIME_WINDOW):
            chunk = ref_codes[first:first + PRIME_WINDOW]
            np.copyto(self.window[:g * len(chunk)].reshape(g, len(chunk)), chunk.T)
            self.start[0] = first
            self.plans[(side, len(chunk))].run()
            side = 1 - side
        return tuple(np.array(state, copy=True) for state in self.states[side])
