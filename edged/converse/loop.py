"""The voice loop as a client of the daemon: hear a turn, transcribe it, let an LLM answer, speak the
answer with the session, and build the next prompt from what was heard (docs/converse.md).

Two threads. The listener reads the daemon's event socket (echo-cancelled `mic` audio, `vad`,
`playback`) and never blocks on a network call: its turns (edged/converse/turns.py) go into a queue,
so a user who speaks while the LLM still streams, or over the reply, is heard all the same. The
speaker takes the turns in order: the transcription endpoint (the history's `asr` client), then the
session's history as an LLM takes it (`Client.messages`, after pending calibrations: a reply that was
cut counts as far as it was heard), the user's turn added, the LLM's answer streamed into a `speak`
with the session (text filter on). A failing endpoint is one line and the loop listens on.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgpack
import numpy as np
import zmq

from edged.audio.wav import from_s16, wav_bytes
from edged.client import Client, RequestRejected, subscribe
from edged.converse.chat import LlmError, completion_pieces
from edged.converse.turns import RATE, Turn, TurnTaker
from edged.history.asr import Transcriber, TranscriptionError


@dataclass(frozen=True)
class Settings:
    asr_url: str
    """An OpenAI-compatible transcription endpoint (.../v1/audio/transcriptions)."""
    asr_model: str
    llm_url: str
    """An OpenAI-compatible chat completions endpoint (.../v1/chat/completions)."""
    llm_model: str
    session: str = "converse"
    system: str | None = None
    voice: str | None = None
    language: str | None = None
    wake: str | None = None
    """A phrase the transcript must hold before the loop answers (then it stays awake `awake_s`)."""
    awake_s: float = 30.0
    preroll_ms: int = 300
    end_silence_ms: int = 600
    asr_timeout_s: float = 10.0
    llm_timeout_s: float = 120.0
    api_key: str | None = None
    endpoint: str | None = None
    """The daemon (None: found as the commands find it)."""
    events: str | None = None
    """The daemon's event socket (None: the one its status names)."""


@dataclass
class Timing:
    """Where one turn's time went, each mark in ms after the end of speech."""

    decided_ms: float
    """End of speech -> end of turn decided (the microphone's clock)."""
    transcript_ms: float | None = None
    first_token_ms: float | None = None
    first_audio_ms: float | None = None
    """-> the answer's first sample at the speaker (its first `playback` event less what it had played)."""

    def line(self) -> str:
        marks = [("turn decided", self.decided_ms), ("transcript", self.transcript_ms),
                 ("first LLM token", self.first_token_ms), ("first audio", self.first_audio_ms)]
        return "timing: end of speech -> " + ", ".join(f"{name} {ms:.0f} ms" for name, ms in marks if ms is not None)


@dataclass
class Heard:
    """A turn the listener made, with the wall time of its end of speech."""

    turn: Turn
    speech_end_at: float


@dataclass
class Shared:
    """What the listener learns that the speaker needs: when each reply's first audio was played."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    first_audio: dict[str, float] = field(default_factory=dict)


def after_wake(text: str, wake: str) -> str | None:
    """The transcript after the wake phrase (case, punctuation and spacing aside), or None without it."""
    phrase = re.findall(r"[\w']+", wake.lower())
    tokens = list(re.finditer(r"[\w']+", text))
    said = [t.group().lower() for t in tokens]
    for i in range(len(said) - len(phrase) + 1):
        if phrase and said[i:i + len(phrase)] == phrase:
            return text[tokens[i + len(phrase) - 1].end():].lstrip(" ,.!?;:-")
    return None


class Converse:
    def __init__(self, settings: Settings, *, say: Callable[[str], None] = print):
        self.settings = settings
        self.say = say
        self.transcriber = Transcriber(settings.asr_url, settings.asr_model, timeout_s=settings.asr_timeout_s)
        self.turns = TurnTaker(preroll_ms=settings.preroll_ms, end_silence_ms=settings.end_silence_ms)
        self.heard: queue.SimpleQueue[Heard | None] = queue.SimpleQueue()
        self.shared = Shared()
        self.awake_until = 0.0
        self.speech_end_at = time.time()
        """Wall time of the last `vad` stop (the daemon's clock, `t`)."""
        self.llm_error: str | None = None
        self.timings: list[Timing] = []
        """Each answered turn's, in order."""
        self.answered = 0
        """Turns the speaker has finished with (answered, skipped or failed)."""

    def run(self, stop: threading.Event) -> None:
        """Listen and answer until `stop` is set."""
        with Client(self.settings.endpoint) as client:
            status = client.status()
        events = self.settings.events or status.get("events")
        microphone = status["audio"]["input"]
        if microphone["state"] != "open":
            self.say(f"converse: the daemon's microphone is {microphone['state']}"
                     + (f" ({microphone['error']})" if microphone.get("error") else "")
                     + ": nothing is heard until it opens (audio.input_device, `edged devices`)")
        if not events:
            raise ConnectionError("the daemon publishes no events (events.listen = \"none\"): converse hears "
                                  "through its event socket")
        sub = subscribe(events, ("vad", "mic", "playback"))
        speaker = threading.Thread(target=self._speaker, name="converse-speaker", daemon=True)
        speaker.start()
        try:
            self._listen(sub, stop)
        finally:
            self.heard.put(None)
            speaker.join(timeout=self.settings.llm_timeout_s)
            sub.close(linger=0)

    # ------------------------------------------------------------------------- the listener

    def _listen(self, sub: zmq.Socket, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(100):
                continue
            frames = sub.recv_multipart()
            header = msgpack.unpackb(frames[1])
            kind = header.get("event")
            if kind == "vad":
                counted = self.turns.vad(header["state"], header["mic_sample"],
                                         while_playing=header.get("while_playing", False),
                                         near_end=header.get("near_end", True))
                if counted and header["state"] == "stop":  # the end of the user's speech, not of an echo
                    self.speech_end_at = header["t"]
            elif kind == "mic" and len(frames) > 2:
                turn = self.turns.mic(header["first_sample"], np.frombuffer(frames[2], "<i2"))
                if turn is not None:
                    self.heard.put(Heard(turn, self.speech_end_at))
            elif kind == "playback":
                with self.shared.lock:  # every client's replies: the oldest forgotten past a few hundred
                    self.shared.first_audio.setdefault(str(header["id"]), header["t"] - header["played_ms"] / 1000)
                    if len(self.shared.first_audio) > 256:
                        del self.shared.first_audio[next(iter(self.shared.first_audio))]

    # ------------------------------------------------------------------------- the speaker

    def _speaker(self) -> None:
        with Client(self.settings.endpoint, timeout_s=self.settings.llm_timeout_s) as client:
            while (heard := self.heard.get()) is not None:
                try:
                    self._answer(client, heard)
                finally:
                    self.answered += 1

    def _answer(self, client: Client, heard: Heard) -> None:
        s, turn = self.settings, heard.turn
        timing = Timing(turn.decided_ms)
        try:
            text = self.transcriber.transcribe(wav_bytes(from_s16(turn.pcm), RATE)).strip()
        except TranscriptionError as exc:
            self.say(f"converse: transcription failed ({s.asr_url}): {exc}; listening on")
            return
        timing.transcript_ms = (time.time() - heard.speech_end_at) * 1000
        prompt = self._woken(text)
        self.say(f"user: {text}" + ("" if prompt is not None else "  [not addressed: no wake phrase]"))
        if not prompt:
            return
        client.turn(s.session, "user", prompt)
        messages = ([{"role": "system", "content": s.system}] if s.system else []) + client.messages(s.session)
        self.llm_error = None
        try:
            utterance = client.speak_iter(self._pieces(messages, heard, timing), session=s.session, voice=s.voice,
                                          language=s.language)
            done = utterance.wait()
        except RequestRejected as exc:
            self.say(f"converse: the daemon refused the answer: {exc.reason}")
            return
        if self.llm_error is not None:  # what was said before it failed stays said
            self.say(f"converse: the LLM failed ({s.llm_url}): {self.llm_error}; listening on")
        with self.shared.lock:
            played = self.shared.first_audio.pop(str(done.id), None)
        if played is not None:
            timing.first_audio_ms = (played - heard.speech_end_at) * 1000
        heard_text = next((m["content"] for m in reversed(client.messages(s.session)) if m["role"] == "assistant"), "")
        self.say(f"assistant: {heard_text}" + ("  [interrupted]" if done.reason == "interrupted" else ""))
        self.say(timing.line())
        self.timings.append(timing)

    def _pieces(self, messages: list[dict], heard: Heard, timing: Timing) -> Iterator[str]:
        """The LLM's answer as it streams; a failure ends it (kept in llm_error), so the speak ends too."""
        try:
            for piece in completion_pieces(self.settings.llm_url, self.settings.llm_model, messages,
                                           self.settings.api_key, self.settings.llm_timeout_s):
                if timing.first_token_ms is None:
                    timing.first_token_ms = (time.time() - heard.speech_end_at) * 1000
                yield piece
        except LlmError as exc:
            self.llm_error = str(exc)

    def _woken(self, text: str) -> str | None:
        """The prompt in `text`: all of it while awake; without a wake phrase set, always; else what
        follows the wake phrase (which wakes the loop), or None."""
        wake = self.settings.wake
        if wake is None or time.monotonic() < self.awake_until:
            if wake is not None:
                self.awake_until = time.monotonic() + self.settings.awake_s
            return text
        rest = after_wake(text, wake)
        if rest is not None:
            self.awake_until = time.monotonic() + self.settings.awake_s
        return rest
