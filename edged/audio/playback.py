"""Local playback: one output stream, replies in admission order, a cursor measured at the DAC.

Threads and who owns what:
- The producer (the thread that has PCM, normally the vocoder's consumer) calls `begin`, `write`,
  `end`; any thread may call `stop_now`, `played`, `status`. These take `_lock`.
- The audio callback copies ring samples into the device buffer, or writes silence and counts an
  underrun. It never locks, sleeps or allocates a buffer; it reads the segment table (where each
  reply's samples lie in the ring, and whether it was stopped) and appends to the timeline.

The cursor: for each contiguous run of ring samples it outputs, the callback records the run's
first ring index and the DAC time of its first sample (`outputBufferDacTime` + offset / rate).
`played(reply)` counts the reply's samples whose DAC time <= the stream clock now (`stream.time`):
what has passed the DAC, not what was written or handed to the driver.

When the device rate differs from the artifact's, the producer resamples with soxr
(`soxr.ResampleStream`) before the ring; the callback only ever copies device-rate samples.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.audio.portaudio import close_stream, sounddevice
from edged.audio.ring import PcmRing
from edged.audio.scheduling import Granted, raise_this_thread
from edged.audio.tap import Tap

log = logging.getLogger(__name__)

_NO_END = 1 << 62
"""Segment end while the reply is still being written."""
_SEGMENTS = 64
"""Replies in the ring at once (queued ones are not in the ring yet)."""
_TIMELINE = 1024
"""Recorded output runs (about one per callback; a few more at reply boundaries)."""
_CALLBACK_LOG = 4096
"""Recorded callback durations (a ring; the maximum is kept separately)."""
_MAX_RESAMPLE_CHUNK = 8192
"""Input samples resampled per `write` call when the device rate differs."""
_KEEP_REPLIES = 256
"""Finished replies whose cursor stays queryable."""


@dataclass
class _Reply:
    reply_id: Hashable
    seq: int
    """Admission order; also picks the segment slot (seq % _SEGMENTS) once writing starts."""
    slot: int = -1
    start: int = -1
    """Ring index of the first sample; -1 until the reply is the one being written."""
    end: int = -1
    """Ring index after the last sample; -1 until end (or stop) and the resampler tail are in the ring."""
    accepted: int = 0
    """Input samples (artifact rate) accepted by `write`."""
    ended: bool = False
    stopped: bool = False
    final_played: int = -1
    """Device samples heard, once the whole reply has passed the DAC (or was cut)."""


class Playback:
    """A sounddevice OutputStream (float32 mono) fed from a ring allocated here, once.

    device: a name (matched as sounddevice matches names) or index; None: PortAudio's default output.
    sample_rate: the PCM's rate (the artifact's, 24000). The device is opened at this rate when it
    accepts it, else at its default rate with soxr resampling on the producer side.
    blocksize: frames per callback; 0 lets the host choose (lowest latency, JACK's period).
    latency: seconds, or "low"/"high" as sounddevice takes it.
    ring_seconds: ring capacity; bounds how far generation may run ahead of the speaker.
    tap_seconds: > 0 keeps that much of what was sent to the DAC in `tap` (the echo canceller's
    reference).
    realtime_priority: what the callback's thread asks for at its first call (edged/audio/
    scheduling.py; 0: nothing); `scheduling` is what it got.
    """

    def __init__(self, device: str | int | None = None, sample_rate: int = 24000, blocksize: int = 0,
                 latency: float | str = "low", ring_seconds: float = 4.0, tap_seconds: float = 0.0,
                 realtime_priority: int = 0) -> None:
        sd = sounddevice()  # here, not at import: PortAudio enumerates devices when loaded

        self.sample_rate = int(sample_rate)
        info = sd.query_devices(device, kind="output")
        self.device_name = str(info["name"])
        try:
            sd.check_output_settings(device=device, channels=1, dtype="float32", samplerate=self.sample_rate)
            self.device_rate = self.sample_rate
        except sd.PortAudioError:
            self.device_rate = int(info["default_samplerate"])

        # -- boot: every buffer the stream will use, in a fixed order ------------------------------
        self._ring = PcmRing(max(1, math.ceil(ring_seconds * self.device_rate)))
        self._resampler: Any = None
        self._pending = np.zeros(0, dtype=np.float32)
        if self.device_rate != self.sample_rate:
            import soxr

            self._resampler = soxr.ResampleStream(self.sample_rate, self.device_rate, 1, dtype="float32", quality="HQ")
            ratio = self.device_rate / self.sample_rate
            self._pending = np.zeros(math.ceil(_MAX_RESAMPLE_CHUNK * ratio) + 4096, dtype=np.float32)
        self._pending_n = 0
        self.tap = Tap(self.device_rate, tap_seconds) if tap_seconds > 0 else None
        # Segment table: where each reply lies in the ring. The producer fills a slot before it
        # publishes `_seg_n`; the callback owns `_seg_cur` and `_seg_cut`.
        self._seg_start = [0] * _SEGMENTS
        self._seg_end = [_NO_END] * _SEGMENTS
        self._seg_stop = [False] * _SEGMENTS
        self._seg_cut = [-1] * _SEGMENTS
        self._seg_n = 0
        self._seg_cur = 0
        # Timeline of output runs (written by the callback; slot filled before `_tl_n` is bumped).
        self._tl_ring = [0] * _TIMELINE
        self._tl_frames = [0] * _TIMELINE
        self._tl_dac = [0.0] * _TIMELINE
        self._tl_now = [0.0] * _TIMELINE
        self._tl_n = 0
        self._cb_seconds = np.zeros(_CALLBACK_LOG, dtype=np.float64)
        self._callbacks = 0
        self.callback_max_s = 0.0
        self.underruns = 0
        """Callbacks that found the ring short while a reply was flowing."""
        self.underrun_samples = 0
        """Silence samples (device rate) written in those callbacks."""
        self.xruns = 0
        """Callbacks that PortAudio flagged with output underflow (the host's view)."""
        self._flowing = False

        self._lock = threading.Lock()
        self._replies: OrderedDict[Hashable, _Reply] = OrderedDict()
        self._queue: deque[_Reply] = deque()
        """Begun replies not yet fully in the ring, in admission order; [0] is being written."""
        self._seq = 0
        self._closed = False
        self.realtime_priority = realtime_priority
        self.scheduling: Granted | None = None
        """What the callback's thread runs with (set at its first call)."""

        self._stream = sd.OutputStream(device=device, samplerate=self.device_rate, channels=1, dtype="float32",
                                       blocksize=blocksize, latency=latency, callback=self._callback)
        self.latency_s = float(self._stream.latency)
        self.dac_latency_s = self.latency_s
        """DAC time minus callback time, as the last callback saw it (JACK: the playback port's latency)."""
        self.blocksize = int(blocksize)
        self._stream.start()

    # -- the audio callback ---------------------------------------------------------------------

    def _callback(self, outdata, frames, time_info, status) -> None:
        t0 = time.perf_counter()
        if self.scheduling is None:  # the first call, on the thread PortAudio runs every call on
            self.scheduling = raise_this_thread(self.realtime_priority, keep_real_time=True)
        if status.output_underflow:
            self.xruns += 1
        out = outdata[:, 0]
        ring = self._ring
        dac = time_info.outputBufferDacTime or (time_info.currentTime + self.latency_s)
        self.dac_latency_s = dac - time_info.currentTime
        pos = 0
        while pos < frames:
            cur = self._seg_cur
            limit = frames - pos
            if cur < self._seg_n:
                slot = cur % _SEGMENTS
                r = ring.read
                end = self._seg_end[slot]
                if r >= end:  # this reply is all out: the next one starts here, gapless
                    self._seg_cur = cur + 1
                    continue
                if self._seg_stop[slot]:  # stopped: drop its remainder (end is frozen <= written)
                    self._seg_cut[slot] = r
                    ring.discard(end - r)
                    # what was dropped has passed the DAC once what this callback wrote before it has:
                    # a run of no samples at the new read position (else a reply cut before any of it
                    # played would wait for the next reply's audio to be final)
                    self._mark(ring.read, 0, dac + pos / self.device_rate, time_info.currentTime)
                    continue
                limit = min(limit, end - r)
            r = ring.read
            n = ring.read_into(out[pos:pos + limit])
            if n == 0:
                break
            self._mark(r, n, dac + pos / self.device_rate, time_info.currentTime)
            self._flowing = True
            pos += n
        if pos < frames:
            out[pos:] = 0.0
            if self._flowing and self._seg_cur < self._seg_n:
                self.underruns += 1
                self.underrun_samples += frames - pos
            elif self._seg_cur >= self._seg_n:
                self._flowing = False
        if self.tap is not None:
            self.tap.record(out)
        elapsed = time.perf_counter() - t0
        self._cb_seconds[self._callbacks % _CALLBACK_LOG] = elapsed
        self._callbacks += 1
        if elapsed > self.callback_max_s:
            self.callback_max_s = elapsed

    # -- producer side --------------------------------------------------------------------------

    def begin(self, reply_id: Hashable) -> None:
        """Admit a reply; it plays after every reply begun before it."""
        with self._lock:
            if reply_id in self._replies:
                raise ValueError(f"reply {reply_id!r} already begun")
            reply = _Reply(reply_id, self._seq)
            self._seq += 1
            self._replies[reply_id] = reply
            while len(self._replies) > _KEEP_REPLIES:
                self._replies.popitem(last=False)
            self._queue.append(reply)
            self._advance()

    def write(self, reply_id: Hashable, pcm: np.ndarray) -> int:
        """Offer PCM (float32, artifact rate) of a reply; returns samples accepted, never blocks.

        0 means: not this reply's turn yet (an earlier reply is still being written) or the ring
        is full; offer the rest again later. A stopped reply accepts (and drops) everything.
        """
        with self._lock:
            reply = self._replies[reply_id]
            if reply.stopped:
                return len(pcm)
            if reply.ended:
                raise ValueError(f"reply {reply_id!r}: write after end")
            if not self._queue or self._queue[0] is not reply:
                return 0
            if self._resampler is None:
                n = self._ring.write(pcm)
            else:
                if not self._flush_pending():
                    return 0
                n = min(len(pcm), _MAX_RESAMPLE_CHUNK)
                self._push_resampled(self._resampler.resample_chunk(pcm[:n]))
            reply.accepted += n
            return n

    def end(self, reply_id: Hashable) -> bool:
        """No more PCM for this reply. True when all of it is in the ring; else call `flush` later."""
        with self._lock:
            reply = self._replies[reply_id]
            if reply.stopped or reply.ended:
                return reply.end >= 0 or reply.stopped
            reply.ended = True
            if self._resampler is not None and self._queue and self._queue[0] is reply:
                self._push_resampled(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
            self._advance()
            return reply.end >= 0

    def flush(self) -> bool:
        """Move resampled samples still waiting into the ring; True when none wait."""
        with self._lock:
            done = self._flush_pending()
            self._advance()
            return done

    def stop_now(self, reply_id: Hashable) -> None:
        """Barge-in or cancel: the reply's remaining samples are dropped; silence (or the next
        reply) follows within one callback period. Later writes to it are accepted and dropped."""
        with self._lock:
            reply = self._replies.get(reply_id)
            if reply is None or reply.stopped:
                return
            reply.stopped = True
            if reply.start < 0:  # queued, never written: it simply never plays
                self._queue.remove(reply)
                reply.start = reply.end = 0
                reply.final_played = 0
            else:
                if reply.end < 0:  # being written: freeze its end where the writing stopped
                    self._pending_n = 0
                    reply.end = self._ring.written
                    self._seg_end[reply.slot] = reply.end
                    self._queue.popleft()
                self._seg_stop[reply.slot] = True
            self._advance()

    def stop_all(self) -> None:
        """stop_now for every reply begun and not yet fully played."""
        with self._lock:
            ids = [r.reply_id for r in self._replies.values() if not r.stopped and r.final_played < 0]
        for reply_id in ids:
            self.stop_now(reply_id)

    def _push_resampled(self, y: np.ndarray) -> None:
        n = self._ring.write(y) if self._pending_n == 0 else 0
        rest = len(y) - n
        if self._pending_n + rest > len(self._pending):
            raise RuntimeError(f"playback: resampler output {rest} exceeds the staging buffer ({len(self._pending)})")
        self._pending[self._pending_n:self._pending_n + rest] = y[n:]
        self._pending_n += rest

    def _flush_pending(self) -> bool:
        if self._pending_n:
            n = self._ring.write(self._pending[:self._pending_n])
            self._pending[:self._pending_n - n] = self._pending[n:self._pending_n]
            self._pending_n -= n
        return self._pending_n == 0

    def _advance(self) -> None:
        """Finish the reply being written once all of it is in the ring; start the next one."""
        while self._queue:
            head = self._queue[0]
            if head.start < 0:
                if self._seg_n - self._seg_cur >= _SEGMENTS:
                    return  # the segment table is full; try again on the next call
                if self._resampler is not None:
                    self._resampler.clear()
                slot = self._seg_n % _SEGMENTS
                head.slot, head.start = slot, self._ring.written
                self._seg_start[slot] = head.start
                self._seg_end[slot] = _NO_END
                self._seg_stop[slot] = False
                self._seg_cut[slot] = -1
                self._seg_n += 1  # publish after the slot is filled
            if not head.ended or self._pending_n:
                return
            head.end = self._ring.written
            self._seg_end[head.slot] = head.end
            self._queue.popleft()

    # -- the cursor -----------------------------------------------------------------------------

    def _dac_position(self, now: float) -> int:
        """Ring index: every ring sample below it has passed the DAC (or was dropped)."""
        n = self._tl_n
        for k in range(n - 1, max(-1, n - _TIMELINE), -1):
            i = k % _TIMELINE
            dac = self._tl_dac[i]
            if dac <= now:
                return self._tl_ring[i] + min(self._tl_frames[i], int((now - dac) * self.device_rate) + 1)
        if n == 0:
            return 0
        return self._tl_ring[max(0, n - _TIMELINE) % _TIMELINE]

    def stream_time(self) -> float:
        """The stream clock (seconds), the one the DAC timestamps are in."""
        return float(self._stream.time)

    def played_device_samples(self, reply_id: Hashable, now: float | None = None) -> int:
        """Samples of the reply (device rate) that have passed the DAC at stream time `now`."""
        with self._lock:
            reply = self._replies[reply_id]
            if reply.final_played >= 0:
                return reply.final_played
            if reply.start < 0:
                return 0
            if now is None:
                now = self.stream_time()
            p = self._dac_position(now)
            end = reply.end if reply.end >= 0 else self._ring.written
            cut = self._seg_cut[reply.slot] if reply.stopped else -1
            heard_end = min(p, end) if cut < 0 else min(p, end, cut)
            heard = max(0, heard_end - reply.start)
            if reply.end >= 0 and (p >= reply.end or (cut >= 0 and p >= cut)):
                reply.final_played = heard
            return heard

    def final(self, reply_id: Hashable) -> int | None:
        """Samples of the reply (artifact rate) heard, once it has all passed the DAC or was cut
        and the cut has passed; None while some of it may still play."""
        heard = self.played(reply_id)
        return heard if self._replies[reply_id].final_played >= 0 else None

    def played(self, reply_id: Hashable, now: float | None = None) -> int:
        """Samples of the reply (artifact rate) that have passed the DAC: what the listener heard."""
        heard = self.played_device_samples(reply_id, now)
        if self.device_rate == self.sample_rate:
            return heard
        reply = self._replies[reply_id]
        return min(reply.accepted, heard * self.sample_rate // self.device_rate)

    def played_ms(self, reply_id: Hashable, now: float | None = None) -> int:
        return self.played(reply_id, now) * 1000 // self.sample_rate

    # -- status and shutdown --------------------------------------------------------------------

    def timeline(self) -> list[tuple[int, int, float, float]]:
        """Recorded output runs, oldest first: (first ring index, samples, DAC time of the first,
        callback time), times on the stream clock. For tests and diagnostics."""
        n = self._tl_n
        return [(self._tl_ring[k % _TIMELINE], self._tl_frames[k % _TIMELINE], self._tl_dac[k % _TIMELINE],
                 self._tl_now[k % _TIMELINE]) for k in range(max(0, n - _TIMELINE), n)]

    def ring_start(self, reply_id: Hashable) -> int:
        """Ring index of the reply's first sample (-1 before it is written). For tests and diagnostics."""
        return self._replies[reply_id].start

    @property
    def callbacks(self) -> int:
        """Callbacks so far: a stream whose count stops moving has lost its device."""
        return self._callbacks

    def callback_seconds(self) -> np.ndarray:
        """Durations of the most recent callbacks (a copy; for tests and diagnostics)."""
        n = min(self._callbacks, _CALLBACK_LOG)
        return self._cb_seconds[:n].copy()

    def status(self) -> dict:
        with self._lock:
            playing = [r.reply_id for r in self._replies.values() if r.start >= 0 and r.final_played < 0
                       and not r.stopped]
            queued = len(self._queue)
        return {
            "device": self.device_name,
            "device_rate": self.device_rate,
            "sample_rate": self.sample_rate,
            "blocksize": self.blocksize,
            "latency_ms": round(self.latency_s * 1000, 3),
            "dac_latency_ms": round(self.dac_latency_s * 1000, 3),
            "open": not self._closed,
            "replies_unfinished": playing,
            "replies_queued": queued,
            "ring_fill": self._ring.available(),
            "ring_capacity": self._ring.capacity,
            "underruns": self.underruns,
            "underrun_samples": self.underrun_samples,
            "xruns": self.xruns,
            "callbacks": self._callbacks,
            "callback_max_ms": round(self.callback_max_s * 1000, 3),
        }

    def _mark(self, ring_index: int, frames: int, dac: float, now: float) -> None:
        """One run of the timeline (the callback's): `frames` ring samples from `ring_index` reach the
        DAC at `dac`; written in place (the slot before `_tl_n` is bumped)."""
        i = self._tl_n % _TIMELINE
        self._tl_ring[i] = ring_index
        self._tl_frames[i] = frames
        self._tl_dac[i] = dac
        self._tl_now[i] = now
        self._tl_n += 1

    def close(self, timeout: float = 2.0) -> bool:
        """Abort and close the stream on a helper thread; False if PortAudio did not return in
        `timeout` seconds (a dead device can hang it). The caller is never blocked longer."""
        if self._closed:
            return True
        self._closed = True
        return close_stream(self._stream, "output", timeout)

    def __enter__(self) -> Playback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
