"""Voice cloning: a reference recording -> the talker's speaker conditioning.

`reference` checks and resamples a reference recording; `encoder` runs a Base artifact's clone
encoder graphs (speaker encoder: PCM -> x-vector; codec encoder: PCM -> codec frames) into a
`ClonedVoice` (edged.request)."""

from edged.clone.encoder import VoiceEncoder
from edged.clone.reference import BadReference, reference_pcm
from edged.clone.roles import can_clone

__all__ = ["BadReference", "VoiceEncoder", "can_clone", "reference_pcm"]
