"""The daemon's speaker: generate-ahead buffers per reply, a feeder thread, and the device's life.

Who calls what:
- The cohort loop (one thread) admits a reply with `begin` (admission order is play order), asks
  `room` before each step (a reply whose buffer is full pauses), `write`s its PCM, and says `end`
  (generation complete) or `stop` (cancelled, failed).
- Any thread may `interrupt` (barge-in): every reply on the speaker goes silent at once.
- The feeder thread moves PCM from the reply buffers into `Playback` (which plays one reply at a
  time, in admission order), publishes `playback` events, and calls `ended(reply)` exactly once
  per begun reply, when its last sample has passed the DAC or its cut has: `reply.played` is then
  the cursor (artifact-rate samples heard), final.
- The same thread watches the device: a stream whose callback stops running is lost. Its replies
  end with an error, the stream is abandoned (closing it on a helper thread, never waiting on it),
  PortAudio rescans, and the device is reopened with a doubling backoff. A device missing at boot
  is retried the same way.

Buffers: `replies` generate-ahead rings of `ahead_ms` each, allocated at boot; a reply holds one
from `begin` until it has all gone into the playback ring (or was cut).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.audio.playback import Playback
from edged.audio.portaudio import device_arg, open_error, rescan
from edged.audio.ring import PcmRing
from edged.audio.scheduling import Granted, as_json, raise_this_thread
from edged.audio.watch import Backoff, Stall
from edged.config import AudioConfig
from edged.server.events import Events

log = logging.getLogger("edged.speaker")

TICK_S = 0.004
"""The feeder's period: how often it tops up the playback ring and checks the cursor."""
FEED_CHUNK = 4800
"""Samples moved per write call (200 ms at 24 kHz)."""

Ended = Callable[["Reply"], None]


@dataclass(eq=False)
class Reply:
    """A reply on the speaker. The loop holds it as a handle; fields say who writes them."""

    key: Hashable
    id: Any
    """The client's id, for events."""
    buffer: PcmRing
    ended: bool = False
    """loop: generation complete, nothing more will be written."""
    stopped: bool = False
    """loop or barge-in: cut; the rest is dropped."""
    interrupted: bool = False
    """barge-in: cut because the user spoke."""
    cut_at_mic: int | None = None
    """barge-in: the microphone stream's position (VAD-rate samples) at which the listener decided."""
    error: str | None = None
    """feeder: why the speaker could not play it (device lost)."""
    end_sent: bool = False
    """feeder: Playback.end called."""
    played: int = 0
    """feeder: the cursor at the last tick (artifact-rate samples)."""
    last_event: float = 0.0
    finished: bool = False


class Speaker:
    def __init__(self, cfg: AudioConfig, sample_rate: int, replies: int, events: Events, ended: Ended,
                 *, tap_seconds: float = 0.0) -> None:
        self.cfg = cfg
        self.sample_rate = sample_rate
        self.events = events
        self.ended = ended
        self.tap_seconds = tap_seconds
        self.ahead = max(1, cfg.ahead_ms * sample_rate // 1000)
        self._pool = [PcmRing(self.ahead) for _ in range(replies)]
        self._free = list(range(replies))
        self._replies: list[tuple[int, Reply]] = []
        """(pool index, reply) in admission order; guarded by _lock."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self.playback: Playback | None = None
        self.state = "off" if cfg.device == "none" else "none"
        """off (configured so) | none (no device yet) | open | lost."""
        self.error: str | None = None
        self.opened = 0
        self.lost = 0
        self._backoff = Backoff(cfg.reopen_min_ms / 1000, cfg.reopen_max_ms / 1000)
        self._stall = Stall(cfg.lost_after_ms / 1000)
        self.before_rescan: Callable[[], None] = lambda: None
        """Called before PortAudio rescans (close other streams); after it, `after_rescan`."""
        self.after_rescan: Callable[[], None] = lambda: None
        self._thread = threading.Thread(target=self._run, name="edged-speaker", daemon=True)
        self.scheduling: Granted | None = None
        """What the feeder's thread runs with (set when it starts)."""

    @property
    def claimed_bytes(self) -> int:
        return sum(r.capacity * 4 for r in self._pool)

    # ----------------------------------------------------------------------------- boot

    def start(self) -> None:
        """Open the device (a missing one is retried in the background) and start the feeder."""
        if self.state != "off":
            self._open(rescan_first=False)
        self._thread.start()

    def _open(self, rescan_first: bool) -> None:
        if rescan_first:  # other streams stay closed (held) until the speaker has tried to open
            self.before_rescan()
            if not rescan():
                self._schedule_reopen("PortAudio did not re-initialize (an old stream is stuck in it)")
                return
        try:
            playback = Playback(device_arg(self.cfg.device), self.sample_rate, blocksize=self.cfg.blocksize,
                                latency=self.cfg.latency_ms / 1000 if self.cfg.latency_ms else "low",
                                ring_seconds=self.cfg.ring_ms / 1000, tap_seconds=self.tap_seconds,
                                realtime_priority=self.cfg.realtime_priority)
        except Exception as exc:  # no such device, device busy, no PortAudio devices at all
            self._schedule_reopen(open_error("output", self.cfg.device, exc))
            if rescan_first:
                self.after_rescan()
            return
        self.playback = playback
        self.state, self.error = "open", None
        self._backoff.succeeded()
        self._stall.restart()
        self.opened += 1
        log.info("speaker open: %s at %d Hz (latency %.1f ms)", playback.device_name, playback.device_rate,
                 playback.latency_s * 1e3)
        self.events.publish("device", {"stream": "output", "state": "open", "device": playback.device_name})
        if rescan_first:
            self.after_rescan()

    def _schedule_reopen(self, why: str) -> None:
        delay = self._backoff.failed()
        if self.error != why:
            log.warning("speaker: %s; retrying in %.1f s (backing off to %.0f s)", why, delay, self._backoff.max_s)
        self.error = why

    @property
    def available(self) -> bool:
        return self.playback is not None

    # ----------------------------------------------------------------------------- the loop's side

    def can_begin(self) -> bool:
        return self.playback is not None and bool(self._free)

    def begin(self, key: Hashable, id: Any) -> Reply | None:
        """Queue a reply to play after every earlier one; None when there is no device or no buffer."""
        with self._lock:
            playback = self.playback
            if playback is None or not self._free:
                return None
            index = self._free.pop()
            buffer = self._pool[index]
            buffer.reset()
            reply = Reply(key, id, buffer)
            playback.begin(key)
            self._replies.append((index, reply))
        return reply

    def room(self, reply: Reply) -> int:
        """Samples the reply's buffer takes now (a stopped reply takes anything)."""
        return self.ahead if reply.stopped else reply.buffer.free()

    def write(self, reply: Reply, pcm: np.ndarray) -> None:
        """Copy PCM into the reply's buffer; the caller checked `room`."""
        if reply.stopped:
            return
        n = reply.buffer.write(pcm)
        if n < len(pcm):  # the loop pauses full replies, so this is a bug, not back-pressure
            raise RuntimeError(f"speaker buffer overflow for {reply.id!r}: {len(pcm) - n} samples dropped")
        self._wake.set()

    def end(self, reply: Reply) -> None:
        reply.ended = True
        self._wake.set()

    def stop(self, reply: Reply) -> None:
        """Cut the reply now: silence (or the next reply) within one audio period."""
        if reply.finished or reply.stopped:
            return
        reply.stopped = True
        playback = self.playback
        if playback is not None:
            playback.stop_now(reply.key)
        self._wake.set()

    def interrupt(self, mic_sample: int | None = None) -> list[Reply]:
        """Barge-in: cut every reply on the speaker; returns them (their `ended` calls follow).
        `mic_sample`: where in the microphone's stream the listener decided (for the event)."""
        with self._lock:
            cut = [r for _, r in self._replies if not r.stopped and not r.finished]
        for reply in cut:
            reply.interrupted, reply.cut_at_mic = True, mic_sample
            self.stop(reply)
        return cut

    def speaking(self) -> bool:
        """Whether some reply is being heard now (its first samples have passed the DAC)."""
        with self._lock:
            return any(not r.finished and not r.stopped and r.played > 0 for _, r in self._replies)

    # ----------------------------------------------------------------------------- the feeder thread

    def _run(self) -> None:
        self.scheduling = raise_this_thread(self.cfg.realtime_priority)
        while not self._closing.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            now = time.monotonic()
            playback = self.playback
            if playback is None:
                if self.state != "off" and self._backoff.due(now):
                    self._open(rescan_first=True)
                continue
            with self._lock:
                replies = list(self._replies)
            for _, reply in replies:
                self._feed(playback, reply)
            playback.flush()
            for index, reply in replies:
                self._settle(playback, index, reply, now)
            if self._stall.lost(playback.callbacks, now):
                self._on_lost(playback, replies)

    def _feed(self, playback: Playback, reply: Reply) -> None:
        if reply.stopped:
            reply.buffer.clear()
            return
        while True:
            view = reply.buffer.peek(FEED_CHUNK)
            if not len(view):
                break
            n = playback.write(reply.key, view)
            reply.buffer.discard(n)
            if n < len(view):
                break
        if reply.ended and not reply.end_sent and reply.buffer.available() == 0:
            playback.end(reply.key)
            reply.end_sent = True

    def _settle(self, playback: Playback, index: int, reply: Reply, now: float) -> None:
        if reply.end_sent or reply.stopped:
            final = playback.final(reply.key)
            if final is not None:
                self._finish(index, reply, final)
                return
        reply.played = playback.played(reply.key)
        if reply.played and now - reply.last_event >= self.cfg.playback_event_ms / 1000:
            reply.last_event = now
            self.events.publish("playback", {"id": reply.id, "played_ms": self._ms(reply.played)})

    def _finish(self, index: int, reply: Reply, played: int) -> None:
        reply.finished, reply.played = True, played
        with self._lock:
            self._replies.remove((index, reply))
            self._free.append(index)
        self.events.publish("playback", {"id": reply.id, "played_ms": self._ms(played), "final": True})
        if reply.interrupted:
            self.events.publish("barge_in", {"id": reply.id, "played_ms": self._ms(played), "mic_sample": reply.cut_at_mic})
        self.ended(reply)

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self.sample_rate

    def _on_lost(self, playback: Playback, replies: list[tuple[int, Reply]]) -> None:
        why = f"audio device lost: {playback.device_name} stopped calling back for {self.cfg.lost_after_ms} ms"
        log.error("speaker: %s", why)
        self.playback, self.state, self.error = None, "lost", why
        self.lost += 1
        self.events.publish("device", {"stream": "output", "state": "lost", "device": playback.device_name})
        threading.Thread(target=playback.close, name="edged-speaker-abandon", daemon=True).start()
        for index, reply in replies:
            if not reply.finished:
                reply.error = why
                self._finish(index, reply, reply.played)
        self.before_rescan()  # the microphone waits for the rescan too
        self._schedule_reopen(why)

    # ----------------------------------------------------------------------------- status, shutdown

    def played_ms(self, reply: Reply, playback: Playback | None = None) -> int:
        """The reply's cursor now (from the DAC clock when the device is open), in ms."""
        if playback is not None and not reply.finished:
            return self._ms(playback.played(reply.key))
        return self._ms(reply.played)

    def status(self) -> dict:
        playback = self.playback
        with self._lock:
            live = [r for _, r in self._replies if not r.finished]
        replies = [{"id": r.id, "played_ms": self.played_ms(r, playback), "generating": not r.ended and not r.stopped}
                   for r in live]
        out: dict[str, Any] = {"state": self.state, "configured": self.cfg.device or "(default)",
                               "replies": replies, "buffers_free": len(self._free), "opened": self.opened,
                               "lost": self.lost}
        if self.error and self.state != "open":
            out["error"] = self.error
        if playback is not None:
            out.update(playback.status())
        out["scheduling"] = {"feeder": as_json(self.scheduling),
                             "callback": as_json(playback.scheduling if playback is not None else None)}
        return out

    def close(self) -> None:
        """Stop the feeder; close the stream without ever waiting on a hung device."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        playback, self.playback = self.playback, None
        if playback is not None:
            playback.close(timeout=2.0)
