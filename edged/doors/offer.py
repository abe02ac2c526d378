"""What the daemon's model offers a front door: its voices, its languages (with the language codes
Home Assistant and OpenAI clients use), whether it takes a style instruction. Read from the daemon
(`status.model` and `voices`), kept for `ttl_s`, so a request costs no extra round trip."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from edged.doors.link import DaemonLink

DEFAULT_VOICE = "default"
"""The voice name that means the model's default (a speak with no `voice`)."""

LANGUAGE_CODES = {"chinese": "zh", "english": "en", "japanese": "ja", "korean": "ko", "german": "de", "french": "fr",
                  "russian": "ru", "portuguese": "pt", "spanish": "es", "italian": "it", "beijing_dialect": "zh",
                  "sichuan_dialect": "zh", "cantonese": "yue"}
"""Qwen3's language names -> ISO 639 codes; a name not here is its own code."""


class UnknownChoice(ValueError):
    """A voice or language the model does not have; the message lists those it has."""


def code(language: str) -> str:
    return LANGUAGE_CODES.get(language, language)


@dataclass(frozen=True)
class Offer:
    model_type: str
    sample_rate: int
    voices: list[dict[str, Any]]
    """As the daemon's `voices` lists them: built-in speakers, then enrolled voices."""
    languages: list[str]
    """The model's language names ("english", ...), as a speak's `language` takes them."""
    instruct: bool

    @property
    def voice_names(self) -> list[str]:
        return [DEFAULT_VOICE, *(v["name"] for v in self.voices)]

    def voice(self, name: str | None) -> str | None:
        """The speak's `voice` for a front door's voice name (None or "default": the model's default)."""
        if name is None or name.lower() == DEFAULT_VOICE:
            return None
        if name.lower() not in (v["name"] for v in self.voices):
            raise UnknownChoice(f"unknown voice {name!r} (this model's voices: {', '.join(self.voice_names)})")
        return name.lower()

    def language(self, wanted: str | None) -> str | None:
        """The speak's `language` for a language name or code ("en", "en-US", "english"); None: auto."""
        if wanted is None or wanted.lower() == "auto":
            return None
        wanted = wanted.lower().replace("_", "-")
        if wanted.replace("-", "_") in self.languages:
            return wanted.replace("-", "_")
        primary = wanted.split("-")[0]
        for name in self.languages:  # the plain language before its dialects ("zh" is chinese)
            if code(name) == primary and "dialect" not in name:
                return name
        for name in self.languages:
            if code(name) == primary:
                return name
        raise UnknownChoice(f"unknown language {wanted!r} (this model's languages: "
                            f"{', '.join(f'{code(n)} ({n})' for n in self.languages) or 'none'})")

    def codes(self, voice: dict[str, Any] | None = None) -> list[str]:
        """The language codes a voice speaks: a dialect speaker's own, else every one of the model's."""
        if voice is not None and voice.get("dialect"):
            return [code(voice["dialect"])]
        return sorted({code(n) for n in self.languages})

    def streams_text(self, voice: str | None) -> bool:
        """Whether a speak in `voice` may take its text as it comes (a voice cloned in context needs it whole)."""
        return not any(v["name"] == voice and v.get("mode") == "icl" for v in self.voices)


class OfferCache:
    """The daemon's Offer, asked again when it is older than ttl_s (enrolled voices come and go)."""

    def __init__(self, link: DaemonLink, ttl_s: float = 10.0):
        self.link = link
        self.ttl_s = ttl_s
        self._offer: Offer | None = None
        self._at = 0.0

    async def get(self, fresh: bool = False) -> Offer:
        if fresh or self._offer is None or time.monotonic() - self._at > self.ttl_s:
            status = await self.link.status()
            model = status["model"]
            self._offer = Offer(model["type"], model["sample_rate"], await self.link.voices(), model["languages"],
                                model["instruct"])
            self._at = time.monotonic()
        return self._offer
