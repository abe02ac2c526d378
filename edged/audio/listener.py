"""The microphone: capture, echo cancellation, voice activity, barge-in, and the `mic` events.

    input callback --(Tap)--> listener thread, one block (~10 ms) at a time:
        reference = what the speaker sent to its DAC, read just behind its newest sample
        -> EchoCanceller (mic rate) -> soxr to 16 kHz -> 512-sample frames -> silero VAD
        -> SpeechGate: "start" / "stop" -> `vad` events; a start while a reply is heard -> barge-in
        -> `mic` events: the echo-cancelled 16 kHz audio, s16le, one per VAD frame

Barge-in calls `Speaker.interrupt()` on this thread: the speaker's callback drops what is left at its
next block (silence within one audio period); the speaker then ends each cut reply with
`interrupted` and its exact cursor. The callback only copies into the tap; everything else runs here.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from edged.audio.echo import EchoCanceller
from edged.audio.portaudio import close_stream, device_arg, open_error, sounddevice
from edged.audio.scheduling import Granted, as_json, raise_this_thread
from edged.audio.speaker import Speaker
from edged.audio.tap import Tap
from edged.audio.vad import SpeechGate, Vad
from edged.audio.watch import Backoff, Lag, Stall
from edged.config import AudioConfig, VadConfig
from edged.server.events import Events

log = logging.getLogger("edged.listener")

MIC_SECONDS = 4.0
"""Microphone samples kept in the tap: how far the listener thread may fall behind."""
NEAR_END_SHARE = 0.5
"""Speech barges in only when at least this share of the echo canceller's blocks over the last
vad.min_speech_ms stood above the echo expected in them (`EchoCanceller.near_end`)."""
REALIGN_AFTER_S = 0.5
"""The speaker's tap may run this far ahead of the reference before the two are realigned."""
RESAMPLE_QUALITY = "LQ"
"""soxr quality of the microphone's resampling to the VAD's 16 kHz. A streaming resampler holds back
its filter's delay, and every VAD decision waits for it: at 24 kHz in, HQ holds back 21 ms, LQ 6 ms.
The VAD decides as early on LQ as on HQ within a frame (scripts/bench/vad.py --quality)."""


def near_blocks(min_speech_ms: int, rate: int, block: int) -> int:
    """The canceller's blocks whose near-end verdicts a VAD start is judged by: those of the last
    min_speech_ms (at least one)."""
    return max(1, -(-min_speech_ms * rate // (1000 * block)))


def near_end_met(near: np.ndarray, heard_blocks: int) -> bool:
    """Whether speech now may barge in: the window of the canceller's verdicts (`near`, near_blocks
    long) lies within the reply being heard (`heard_blocks` of it so far) and at least
    NEAR_END_SHARE of them were near-end."""
    return heard_blocks >= len(near) and float(near.mean()) >= NEAR_END_SHARE


class Microphone:
    """A sounddevice InputStream (float32 mono) whose callback only records into `tap`."""

    def __init__(self, device: int | str | None, rate: int | None, blocksize: int, latency: float | str,
                 realtime_priority: int = 0) -> None:
        sd = sounddevice()
        info = sd.query_devices(device, kind="input")
        self.device_name = str(info["name"])
        self.rate = int(info["default_samplerate"])
        if rate is not None:
            try:
                sd.check_input_settings(device=device, channels=1, dtype="float32", samplerate=rate)
                self.rate = rate
            except sd.PortAudioError:
                pass
        self.tap = Tap(self.rate, MIC_SECONDS)
        self.callbacks = 0
        self.overflows = 0
        self.realtime_priority = realtime_priority
        self.scheduling: Granted | None = None
        """What the callback's thread runs with (set at its first call)."""
        self._stream = sd.InputStream(device=device, samplerate=self.rate, channels=1, dtype="float32",
                                      blocksize=blocksize, latency=latency, callback=self._callback)
        self.latency_s = float(self._stream.latency)
        self._stream.start()

    def _callback(self, indata, frames, time_info, status) -> None:
        if self.scheduling is None:  # the first call, on the thread PortAudio runs every call on
            self.scheduling = raise_this_thread(self.realtime_priority, keep_real_time=True)
        if status.input_overflow:
            self.overflows += 1
        self.tap.record(indata[:, 0])
        self.callbacks += 1

    def close(self, timeout: float = 2.0) -> bool:
        return close_stream(self._stream, "input", timeout)


class Listener:
    def __init__(self, audio: AudioConfig, vad: VadConfig, events: Events, speaker: Speaker | None,
                 *, mic_audio: bool = True) -> None:
        self.cfg, self.vad_cfg = audio, vad
        self.events, self.speaker = events, speaker
        self.mic_audio = mic_audio
        self.vad = Vad(vad.threshold)
        self.gate = SpeechGate(vad.threshold, min_speech_ms=vad.min_speech_ms, min_silence_ms=vad.min_silence_ms)
        self.mic: Microphone | None = None
        self.echo: EchoCanceller | None = None
        self.near = np.zeros(1, dtype=bool)
        """The canceller's near-end verdict on each of the last blocks (a ring; see NEAR_END_SHARE)."""
        self.ref_offset: int | None = None
        self.state = "none"
        """none (no device yet) | open | lost."""
        self.error: str | None = None
        self.barge_ins = 0
        self.speech_starts = 0
        self.echo_refusals = 0
        """Speech heard while a reply played that the gate took for the reply's own echo."""
        self.heard_blocks = 0
        """Blocks processed in a row while a reply was heard: the near-end share counts only once its
        whole window lies in them (at a reply's first blocks it would still hold the pause's silence)."""
        self.overruns = 0
        self.lag = Lag()
        """How far the listener runs behind the microphone (captured audio not yet processed)."""
        self.scheduling: Granted | None = None
        """What the listener's thread runs with (set when it starts)."""
        self._lock = threading.Lock()
        """Held while the stream is opened, closed or read (the speaker's rescan closes it too)."""
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edged-listener", daemon=True)
        self._backoff = Backoff(audio.reopen_min_ms / 1000, audio.reopen_max_ms / 1000)
        self._stall = Stall(audio.lost_after_ms / 1000)
        self._held = False
        """While the speaker rescans PortAudio, the microphone stays closed."""
        self.frame16 = np.zeros(self.vad.frame, dtype=np.float32)
        self.s16 = np.zeros(self.vad.frame, dtype="<i2")
        self._n16 = 0
        self.mic_samples = 0
        """16 kHz samples published so far (the `first_sample` of the next `mic` event)."""

    # ----------------------------------------------------------------------------- device

    def start(self) -> None:
        self.open()
        self._thread.start()

    def open(self) -> None:
        """Open the microphone (at the speaker's rate when it takes it, for the echo canceller)."""
        with self._lock:
            if self.mic is not None:
                return
            playback = self.speaker.playback if self.speaker is not None else None
            rate = playback.device_rate if playback is not None else None
            try:
                mic = Microphone(device_arg(self.cfg.input_device), rate, self.cfg.blocksize,
                                 self.cfg.latency_ms / 1000 if self.cfg.latency_ms else "low",
                                 self.cfg.realtime_priority)
            except Exception as exc:
                why = open_error("input", self.cfg.input_device, exc)
                if why != self.error:
                    log.warning("listener: %s; retrying with backoff", why)
                self.error = why
                self._backoff.failed()
                return
            self._setup(mic)  # before the stream is published: status() reads what _setup makes
            self.mic, self.state, self.error = mic, "open", None
            self._backoff.succeeded()
        log.info("microphone open: %s at %d Hz (echo cancelling: %s)", mic.device_name, mic.rate,
                 "on" if self.echo is not None else "off")
        self.events.publish("device", {"stream": "input", "state": "open", "device": mic.device_name})

    def _setup(self, mic: Microphone) -> None:
        import soxr

        self.block = 1 << max(6, round(np.log2(mic.rate * 0.01)))  # ~10 ms, a power of two
        self.index = mic.tap.written
        self.mic_block = np.zeros(self.block, dtype=np.float32)
        self.ref_block = np.zeros(self.block, dtype=np.float32)
        self.clean = np.zeros(self.block, dtype=np.float32)
        self.resampler = soxr.ResampleStream(mic.rate, self.vad.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        playback = self.speaker.playback if self.speaker is not None else None
        same_rate = playback is not None and playback.tap is not None and playback.device_rate == mic.rate
        self.echo = None
        if self.vad_cfg.echo_cancel and same_rate and playback is not None:
            # the echo lags the reference by the output's and the input's latency, plus the room
            latency = round((playback.dac_latency_s + mic.latency_s) * mic.rate)
            self.echo = EchoCanceller(mic.rate, self.block, latency=latency)
        self.near = np.ones(near_blocks(self.vad_cfg.min_speech_ms, mic.rate, self.block), dtype=bool)
        self._near_at = 0
        self.ref_offset = None
        self._stall.restart()
        self.vad.reset()
        self.gate.reset()
        self._n16 = 0

    def hold(self) -> None:
        """Close the stream and keep it closed until `release` (PortAudio is being rescanned)."""
        self._held = True
        self.close()

    def release(self) -> None:
        self._held = False
        self._backoff.now()

    def close(self) -> None:
        """Close the stream (never waiting on a hung device for more than 2 s)."""
        with self._lock:
            mic, self.mic = self.mic, None
            if mic is not None:
                self.state = "none"
                mic.close()

    def stop(self) -> None:
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.close()

    # ----------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        self.scheduling = raise_this_thread(self.cfg.realtime_priority)
        while not self._closing.wait(0.005):
            if self.mic is None:
                if not self._held and self._backoff.due(time.monotonic()):
                    self.open()
                continue
            with self._lock:
                mic = self.mic
                if mic is None:
                    continue
                while mic.tap.written - self.index >= self.block:
                    self._block(mic)
                if self._stall.lost(mic.callbacks, time.monotonic()):
                    self._on_lost(mic)

    def _block(self, mic: Microphone) -> None:
        behind = mic.tap.written - self.index
        self.lag.note(behind * 1000 / mic.rate, time.monotonic())
        if behind > mic.tap.capacity // 2:  # fell behind: skip to the newest audio
            self.overruns += 1
            self.index = mic.tap.written - self.block
        mic.tap.read(self.index, self.mic_block)
        if self.echo is not None:
            self._reference(mic)
            self.echo.process(self.mic_block, self.ref_block, self.clean)
            self.near[self._near_at] = self.echo.near_end()
            self._near_at = (self._near_at + 1) % len(self.near)
        else:
            self.clean[:] = self.mic_block
        self.index += self.block
        speaker = self.speaker
        self.heard_blocks = self.heard_blocks + 1 if speaker is not None and speaker.speaking() else 0
        self._vad(self.resampler.resample_chunk(self.clean))

    def _reference(self, mic: Microphone) -> None:
        """The speaker's output as one continuous stream beside the microphone's.

        Whatever the microphone hears of the speaker was in the speaker's tap before the microphone
        captured it, so the reference is read just behind the newest tapped sample: the echo then
        always lags its reference (by the output + input latency), which the canceller estimates.
        The offset between the two taps is the smallest lead seen: reading never passes the tap's
        newest sample, and the offset stays fixed unless the tap runs far ahead (a new stream)."""
        playback = self.speaker.playback if self.speaker is not None else None
        if playback is None or playback.tap is None:
            self.ref_block[:] = 0.0
            self.ref_offset = None
            return
        want = playback.tap.written - self.index - self.block  # the tap's lead past this block's end
        if self.ref_offset is None or want < self.ref_offset or want > self.ref_offset + REALIGN_AFTER_S * mic.rate:
            if self.ref_offset is not None and self.echo is not None:
                self.echo.shift(want - self.ref_offset)
            self.ref_offset = want
        playback.tap.read(self.index + self.ref_offset, self.ref_block)

    def _vad(self, pcm16k: np.ndarray) -> None:
        pos = 0
        while pos < len(pcm16k):
            n = min(len(pcm16k) - pos, self.vad.frame - self._n16)
            self.frame16[self._n16:self._n16 + n] = pcm16k[pos:pos + n]
            self._n16 += n
            pos += n
            if self._n16 == self.vad.frame:
                self._n16 = 0
                self._frame()

    def _frame(self) -> None:
        prob = self.vad.probability(self.frame16)
        self._speech(self.gate.update(prob))
        if self.mic_audio:
            np.multiply(self.frame16, 32767.0, out=self.frame16)
            np.clip(self.frame16, -32768, 32767, out=self.frame16)
            self.s16[:] = self.frame16
            self.events.publish("mic", {"seq": self.mic_samples // self.vad.frame, "sample_rate": self.vad.sample_rate,
                                        "format": "s16le", "first_sample": self.mic_samples,
                                        "samples": self.vad.frame}, self.s16.data)
        self.mic_samples += self.vad.frame

    def _speech(self, event: str | None) -> None:
        """VAD decisions -> `vad` events; user speech (begun now or earlier) while a reply is heard
        -> barge-in, when the echo canceller says the speech stands above the echo it expects over
        blocks of that reply (speech begun in a pause is judged against the reply's echo too)."""
        speaker = self.speaker
        heard = speaker is not None and speaker.speaking()
        near_end = near_end_met(self.near, self.heard_blocks)
        if event is not None:
            self.speech_starts += event == "start"
            self.echo_refusals += event == "start" and heard and not near_end
            mic = self.mic  # captured audio not yet processed: the listener's lag behind the microphone
            behind_ms = (mic.tap.written - self.index) * 1000 / mic.rate if mic is not None else 0.0
            self.events.publish("vad", {"state": event, "mic_sample": self.mic_samples + self.vad.frame,
                                        "behind_ms": round(behind_ms, 1), "while_playing": heard,
                                        "near_end": near_end})
        if heard and self.gate.speaking and near_end and self.cfg.barge_in and speaker is not None:
            cut = speaker.interrupt(self.mic_samples + self.vad.frame)
            if cut:
                self.barge_ins += 1
                log.info("barge-in: user speech while playing; %d repl%s cut", len(cut), "y" if len(cut) == 1 else "ies")

    def _on_lost(self, mic: Microphone) -> None:
        log.error("listener: input device %s stopped calling back for %d ms; reopening with backoff",
                  mic.device_name, self.cfg.lost_after_ms)
        self.mic, self.state = None, "lost"
        self.error = f"input device lost: {mic.device_name}"
        self.events.publish("device", {"stream": "input", "state": "lost", "device": mic.device_name})
        threading.Thread(target=mic.close, name="edged-mic-abandon", daemon=True).start()
        self._backoff.failed()

    # ----------------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        mic = self.mic
        out: dict[str, Any] = {"state": self.state, "configured": self.cfg.input_device or "(default)",
                               "barge_in": self.cfg.barge_in, "speech_starts": self.speech_starts,
                               "barge_ins": self.barge_ins, "echo_refusals": self.echo_refusals,
                               "speaking": self.gate.speaking, "overruns": self.overruns,
                               "behind_ms": round(self.lag.now_ms, 1),
                               "behind_max_ms": round(self.lag.max_ms(time.monotonic()), 1),
                               "scheduling": {"listener": as_json(self.scheduling),
                                              "callback": as_json(mic.scheduling if mic is not None else None)}}
        if self.error and self.state != "open":
            out["error"] = self.error
        if mic is not None:
            out.update(device=mic.device_name, rate=mic.rate, latency_ms=round(mic.latency_s * 1000, 3),
                       overflows=mic.overflows,
                       echo_cancel=self.echo is not None,
                       echo_erle_db=round(self.echo.erle_db, 1) if self.echo is not None else None,
                       echo_delay_ms=round(self.echo.echo_delay() * 1000 / mic.rate, 2) if self.echo is not None else None,
                       echo_alignments=self.echo.lags_found if self.echo is not None else 0,
                       echo_path_changes=self.echo.path_changes if self.echo is not None else 0,
                       echo_drift_ppm=round(self.echo.slide.rate / self.echo.block * 1e6, 1) if self.echo is not None else None,
                       reference_offset=self.ref_offset)
        return out
