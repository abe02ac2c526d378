"""Speaking rates per voice, learned from the daemon's own finished replies (the `rate` policy's
estimate for a reply that was cut before it finished)."""

from __future__ import annotations

import threading

from edged.history.text import unit_count


class VoiceRates:
    """Milliseconds per text unit, per voice, learned from finished replies (a running mean that
    weighs the last `memory` replies); thread-safe reads for the policy's worker threads."""

    def __init__(self, default_ms_per_unit: float, memory: int = 20,
                 known: dict[str, tuple[float, int]] | None = None) -> None:
        self.default = default_ms_per_unit
        self.memory = memory
        self._rates: dict[str, tuple[float, int]] = dict(known or {})
        self._lock = threading.Lock()

    @staticmethod
    def name(voice: str | None) -> str:
        return voice or "(default)"

    def learn(self, voice: str | None, text: str, audio_ms: float) -> tuple[float, int] | None:
        """A reply that finished: its audio covers its whole text. Returns the voice's new rate."""
        units = unit_count(text)
        if units == 0 or audio_ms <= 0:
            return None
        sample = audio_ms / units
        with self._lock:
            mean, n = self._rates.get(self.name(voice), (sample, 0))
            n = min(n + 1, self.memory)
            mean += (sample - mean) / n
            self._rates[self.name(voice)] = (mean, n)
            return mean, n

    def ms_per_unit(self, voice: str | None) -> float:
        with self._lock:
            return self._rates.get(self.name(voice), (self.default, 0))[0]

    def snapshot(self) -> dict[str, tuple[float, int]]:
        with self._lock:
            return dict(self._rates)
