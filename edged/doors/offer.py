"""What the daemon's model offers a front door: its languages (with the language codes Home Assistant
and OpenAI clients use), whether it takes a style instruction, and its voices. The model's facts
come from `status.model` (answered by the cohort loop at once); the voices from `voices` (answered by
the voice thread, which may be busy enrolling one), asked only where a list is needed: `describe`,
an unknown voice's error, a streamed Wyoming request. Both are kept for `ttl_s`."""

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


def speak_voice(name: str | None) -> str | None:
    """A speak's `voice` for a front door's voice name (None or "default": the model's default)."""
    return None if name is None or name.lower() == DEFAULT_VOICE else name.lower()


def unknown_voice(name: str, voices: list[dict[str, Any]]) -> UnknownChoice:
    names = ", ".join([DEFAULT_VOICE, *(v["name"] for v in voices)])
    return UnknownChoice(f"unknown voice {name!r} (this model's voices: {names})")


def streams_text(voices: list[dict[str, Any]], voice: str | None) -> bool:
    """Whether a speak in `voice` may take its text as it comes (a voice cloned in context needs it whole)."""
    return not any(v["name"] == voice and v.get("mode") == "icl" for v in voices)


@dataclass(frozen=True)
class Model:
    type: str
    sample_rate: int
    languages: list[str]
    """Language names ("english", ...), as a speak's `language` takes them."""
    instruct: bool

    def language(self, wanted: str | None) -> str | None:
        """The speak's `language` for a language name or code ("en", "en-US", "english"); None: auto."""
        if wanted is None or wanted.lower() == "auto":
            return None
        wanted = wanted.lower().replace("_", "-")
        if wanted.replace("-", "_") in self.languages:
            return wanted.replace("-", "_")
        primary = wanted.split("-")[0]
        for name in sorted(self.languages, key=lambda n: "dialect" in n):  # "zh" is chinese before a dialect
            if code(name) == primary:
                return name
        raise UnknownChoice(f"unknown language {wanted!r} (this model's languages: "
                            f"{', '.join(f'{code(n)} ({n})' for n in self.languages) or 'none'})")

    def codes(self, voice: dict[str, Any] | None = None) -> list[str]:
        """The language codes a voice speaks: a dialect speaker's own, else every one of the model's."""
        if voice is not None and voice.get("dialect"):
            return [code(voice["dialect"])]
        return sorted({code(n) for n in self.languages})


class OfferCache:
    """The daemon's Model and voices, each asked again when older than ttl_s."""

    def __init__(self, link: DaemonLink, ttl_s: float = 10.0):
        self.link = link
        self.ttl_s = ttl_s
        self._model: tuple[float, Model] | None = None
        self._voices: tuple[float, list[dict[str, Any]]] | None = None

    async def model(self) -> Model:
        if self._model is None or time.monotonic() - self._model[0] > self.ttl_s:
            m = (await self.link.status())["model"]
            self._model = (time.monotonic(), Model(m["type"], m["sample_rate"], m["languages"], m["instruct"]))
        return self._model[1]

    async def voices(self, fresh: bool = False) -> list[dict[str, Any]]:
        """As the daemon's `voices` lists them: built-in speakers, then enrolled voices."""
        if fresh or self._voices is None or time.monotonic() - self._voices[0] > self.ttl_s:
            self._voices = (time.monotonic(), await self.link.voices())
        return self._voices[1]
