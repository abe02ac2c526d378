"""Calibration policies, chosen by `history.policy`: how much of an interrupted reply was heard.

- `rate`: heard units from played_ms minus a guard, at the reply's own rate when it finished
  (its complete duration over its text units), else at the voice's speaking rate learned from the
  daemon's own finished replies; cut to whole words, the last unit withheld. Needs no audio.
- `asr`: the heard audio (played_ms minus the guard) goes to an OpenAI-compatible transcription
  endpoint; only a conservative anchored-prefix alignment of the transcript to the original text is
  accepted (`text.asr_prefix`), the last recognized unit withheld.
- `none`: no policy: an interrupted reply is all or nothing (nothing, since it was cut).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edged.audio.wav import wav_bytes
from edged.history.asr import Transcriber, heard_pcm
from edged.history.calibration import Policy, Snapshot
from edged.history.rates import VoiceRates
from edged.history.text import asr_prefix, rate_prefix, unit_count, units

log = logging.getLogger("edged.history")


@dataclass
class RatePolicy:
    rates: VoiceRates
    guard_ms: float = 160.0
    name: str = "rate"
    requires_audio: bool = False

    def calibrate(self, snapshot: Snapshot) -> int | None:
        units = unit_count(snapshot.text)
        if snapshot.complete_ms and units:
            ms_per_unit = snapshot.complete_ms / units
        else:
            ms_per_unit = self.rates.ms_per_unit(snapshot.voice)
        return rate_prefix(snapshot.text, snapshot.played_ms - self.guard_ms, ms_per_unit, withhold=1)


@dataclass
class AsrPolicy:
    transcriber: Transcriber
    guard_ms: float = 160.0
    name: str = "asr"
    requires_audio: bool = True

    def calibrate(self, snapshot: Snapshot) -> int | None:
        if snapshot.pcm is None:
            return None
        pcm = heard_pcm(snapshot.pcm, snapshot.sample_rate, snapshot.played_ms, guard_ms=self.guard_ms)
        if pcm is None:
            return None  # under half a second heard: too little to transcribe
        transcript = self.transcriber.transcribe(wav_bytes(pcm, snapshot.sample_rate))
        return asr_prefix(_head(snapshot.text, unit_count(transcript)), transcript)


def _head(text: str, heard_units: int) -> str:
    """The part of the original a transcript of `heard_units` units can align with (twice as many
    units, and some), so a long reply is not refused for its unheard rest; offsets stay the original's."""
    spans = units(text)
    keep = 2 * heard_units + 16
    return text if len(spans) <= keep else text[:spans[keep - 1].end]


def make_policy(name: str, *, rates: VoiceRates, guard_ms: float, asr_url: str = "", asr_model: str = "",
                asr_timeout_s: float = 1.0) -> Policy | None:
    if name == "none":
        return None
    if name == "rate":
        return RatePolicy(rates, guard_ms)
    if name == "asr":
        return AsrPolicy(Transcriber(asr_url, asr_model, timeout_s=asr_timeout_s), guard_ms)
    raise ValueError(f"unknown history policy {name!r} (rate, asr or none)")
