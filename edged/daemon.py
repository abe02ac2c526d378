"""The daemon's lifecycle: boot in named steps, serve, drain on SIGTERM, exit 0.

    boot:  config -> CURVE (tcp://: the certificate, the authenticator) -> artifact -> engines +
           preallocate (prints what it claimed) -> warm up -> event socket -> PortAudio (a library
           that cannot load is a warning: no speaker, no microphone) -> speaker (a missing device is
           retried in the background) -> bind the socket -> freeze what boot made out of the
           garbage collector's full collections (edged/collector.py) -> READY=1
    serve: the cohort loop on this (main) thread; the socket on its own thread; WATCHDOG=1 only
           while the loop makes progress
    drain: SIGTERM -> STOPPING=1, stop admitting, let in-flight requests finish until the drain
           deadline, cancel the rest (each still gets its `done`), exit 0. A second signal forces.

Signal handlers only set flags (uvicorn's rule); the loop reads them between frames.
"""

from __future__ import annotations

import logging
import queue
import signal
import sqlite3
import threading
import time
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from edged.artifact import load_artifact
from edged.audio.listener import Listener
from edged.audio.portaudio import missing
from edged.audio.scheduling import audio_threads
from edged.audio.speaker import Speaker
from edged.backends import make_backend
from edged.clone import VoiceEncoder, can_clone
from edged.collector import freeze_boot
from edged.config import Config, ConfigError
from edged.core import Core
from edged.cpu import this_cpu
from edged.history.policies import make_policy
from edged.history.rates import VoiceRates
from edged.history.recorder import Recorder
from edged.history.service import History
from edged.history.store import open_store
from edged.request import Sampling
from edged.scheduler.commands import Drain, PlaybackEnded
from edged.scheduler.loop import CohortLoop
from edged.server.curve import CurveError, load_server_keys, start_authenticator
from edged.server.events import Events
from edged.server.replies import ClientReplies
from edged.server.router import REPLIES, Server
from edged.stopped import ignore_stop_signals
from edged.systemd import BootProgress, Notifier, Watchdog
from edged.voices.service import Limits, VoiceBook, VoiceService, builtin_voices
from edged.voices.store import VoiceStore

log = logging.getLogger("edged.daemon")


class Daemon:
    def __init__(self, config: Config):
        self.config = config
        self.signals = 0
        self.notifier = Notifier()
        self.authenticator: ThreadAuthenticator | None = None

    def run(self) -> int:
        loop, server = self.boot()
        self._install_signals()
        try:
            self.serve(loop)
        finally:
            if self.history is not None:
                self.history.stop()  # its last replies go out before the server's pipe closes
            if self.voices is not None:
                self.voices.stop()
            loop.close()
            self.core.close()
            server.stop()
            if self.listener is not None:
                self.listener.stop()
            if self.speaker is not None:
                self.speaker.close()
            self.events.close()
            if self.authenticator is not None:
                self.authenticator.stop()
            self.watchdog.stop()
            self.backend.close()  # engines and buffers, then (TensorRT) the CUDA context
            log.info("closed the %s backend", self.backend.name)
        ignore_stop_signals()
        log.info("stopped")
        return 0

    # ----------------------------------------------------------------------------- boot

    def boot(self) -> tuple[CohortLoop, Server]:
        cfg = self.config
        t0 = time.monotonic()
        boot = BootProgress(self.notifier)  # EXTEND_TIMEOUT_USEC while each part of the boot gets done
        curve = self._curve()
        boot.stage("loading the engines")
        artifact = load_artifact(cfg.daemon.artifact or None)
        threads = cfg.daemon.threads
        self.backend = make_backend(cfg.daemon.backend, threads.generation, cfg.daemon.cuda_graphs)
        self.backend.progress = boot.step
        defaults = Sampling.defaults(artifact.sampling).with_overrides(
            {k: v for k, v in vars(cfg.sampling).items() if v is not None})
        self.core = core = Core(artifact, self.backend, vocoder_threads=threads.vocoder,
                                chunk_frames=cfg.vocoder.chunk_frames, first_chunk_frames=cfg.vocoder.first_chunk_frames,
                                graph_window=defaults.cp_spec_verify_size)
        log.info("cpu: %s", this_cpu().line())
        log.info("%s", core.vocoder.form.line())
        log.info("threads: generation %d, vocoder %s, clone encoder %d", threads.generation,
                 threads.vocoder if core.worker.threaded else f"on the loop's thread ({cfg.daemon.backend})",
                 threads.clone_encoder)
        self.watchdog = Watchdog(self.notifier)
        self.events = Events(cfg.events_endpoint, curve=curve)
        self.no_portaudio = self._portaudio()
        self.speaker = self._speaker(artifact, core)
        self.history, recorder = self._history(artifact)
        self.voices = self._voices(artifact)
        boot.stage("claiming buffers, binding plans" + (", capturing CUDA graphs" if self.backend.name == "tensorrt"
                                                         and cfg.daemon.cuda_graphs else ""))
        claimed = self._preallocate(core, recorder)
        graphs = self.backend.graph_report()
        if graphs["failed"]:
            log.warning("CUDA graphs: %d of %d step plans captured; %d enqueued per run instead (named above; "
                        "status.backend.cuda_graphs)", graphs["captured"], graphs["marked"], len(graphs["failed"]))
        boot.stage("warming up")
        core.warm_up()
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        no_history = (f"history unavailable ({self.history_error}): speak without a session" if self.history_error
                      else "this daemon keeps no history")
        server = Server(cfg.endpoint, inbox, max_message_bytes=cfg.daemon.max_message_bytes, defaults=defaults,
                        frame_ms=artifact.frame_ms, history=self.history, curve=curve, no_history=no_history,
                        client_queue=cfg.daemon.client_queue, voices=self.voices, no_voices=self.no_voices,
                        builtin_voices=builtin_voices(artifact))
        clients = ClientReplies(server.reply, artifact.sample_rate, core.window_samples)
        loop = CohortLoop(core, clients, inbox=inbox, queue_limit=cfg.daemon.queue_limit, speaker=self.speaker,
                          reject_play_without_device=cfg.audio.on_missing_device == "reject",
                          progress=self.watchdog.progress, stall_after_steps=cfg.daemon.test_stall_after_steps,
                          history=self.history, recorder=recorder, text_timeout_s=cfg.daemon.text_timeout_ms / 1000,
                          first_text_timeout_s=cfg.daemon.first_text_timeout_ms / 1000)
        loop.around.claimed, loop.around.history, loop.around.voices = claimed, self._history_status, self._voices_status
        loop.around.events = cfg.events_endpoint
        self._devices(loop)
        server.start()
        if self.history is not None:
            self.history.start()
        if self.voices is not None:
            self.voices.start()
        log.info("froze %d objects from boot out of the garbage collector's full collections", freeze_boot())
        log.info("serving %s on %s (artifact %s, max_batch %d, %d CUDA graphs, boot %.2f s)", artifact.family,
                 cfg.endpoint, artifact.path, artifact.max_batch, self.backend.graphs(), time.monotonic() - t0)
        boot.done()
        self.notifier.ready()
        self.notifier.status(f"serving on {cfg.endpoint}: 0/{artifact.max_batch} members, 0 queued")
        self.watchdog.start()
        return loop, server

    def _curve(self) -> dict[int, Any] | None:
        """The CURVE server options of the tcp:// sockets, with the authenticator started; None when
        there are no keys (ipc only, or tcp:// with daemon.insecure_tcp, warned about here)."""
        cfg = self.config
        problem = cfg.security_problem()
        if problem:
            raise ConfigError(problem)
        if not cfg.curve:
            for endpoint in cfg.tcp_endpoints:
                log.warning("daemon.insecure_tcp = true: %s has no CURVE; anyone who can reach it is served", endpoint)
            return None
        try:
            keys = load_server_keys(cfg.daemon.curve_secret_key, cfg.daemon.curve_authorized_dir)
        except CurveError as exc:
            raise ConfigError(f"daemon.curve_secret_key / curve_authorized_dir: {exc}") from exc
        self.authenticator = start_authenticator(zmq.Context.instance(), keys)
        return keys.options()

    def _preallocate(self, core: Core, recorder: Recorder | None) -> dict[str, int]:
        """Claim every buffer; log what each part took."""
        claimed = core.preallocate()
        claimed["activations"] = self.backend.activation_bytes()  # one block, every context's (TensorRT)
        if self.voices is not None:
            claimed.update(self.voices.encoder.preallocate())
        if self.speaker is not None:
            claimed["speaker buffers"] = self.speaker.claimed_bytes
        if recorder is not None:
            claimed["history recordings"] = recorder.claimed_bytes
        for part, size in claimed.items():
            log.info("claimed %-24s %10.2f MiB", part, size / 2**20)
        log.info("claimed %-24s %10.2f MiB", "total", sum(claimed.values()) / 2**20)
        return claimed

    def _devices(self, loop: CohortLoop) -> None:
        """Open the speaker and the microphone (missing ones are retried in the background)."""
        self.listener_error = ""
        if self.no_portaudio:
            unavailable = {"state": "unavailable", "error": self.no_portaudio}
            if self.config.audio.device != "none":
                loop.around.output = lambda: dict(unavailable)
            if self.config.audio.input_device != "none":
                loop.around.input = lambda: dict(unavailable)
        self.listener = self._listener()
        if self.listener is not None:
            loop.around.input = self.listener.status
        elif self.listener_error:
            loop.around.input = lambda: {"state": "off", "error": self.listener_error}
        if self.speaker is not None:
            self.speaker.ended = lambda reply: loop.inbox.put(PlaybackEnded(reply))
            self.speaker.start()
        if self.listener is not None:
            self.listener.start()
        self._log_scheduling()

    def _log_scheduling(self, wait_s: float = 1.0) -> None:
        """One line: what each audio thread got of `audio.realtime_priority` (each asks as it starts;
        a callback at its first call): waited for up to `wait_s`, a thread not yet running says so."""
        deadline = time.monotonic() + wait_s
        while True:
            threads = audio_threads(self.speaker, self.listener)
            if all(g is not None for g in threads.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if threads:
            asked = self.config.audio.realtime_priority
            log.info("audio threads (asked: %s): %s",
                     f"SCHED_FIFO {asked}" if asked else "nothing, audio.realtime_priority = 0",
                     "; ".join(f"{name} {g.line() if g is not None else 'not running yet'}"
                               for name, g in threads.items()))

    # ----------------------------------------------------------------------------- serve + drain

    def serve(self, loop: CohortLoop) -> None:
        last_status = 0.0
        while self.signals < 2:
            if self.signals == 1 and loop.draining is None:
                self.notifier.stopping()
                log.info("draining: %d in flight, deadline %.1f s", len(loop.scheduler.by_key),
                         self.config.daemon.drain_timeout_s)
                loop.inbox.put(Drain(time.monotonic() + self.config.daemon.drain_timeout_s))
            loop.iteration()
            if loop.draining is not None and not loop.busy:
                return
            now = time.monotonic()
            if now - last_status >= 1.0:
                s = loop.scheduler
                self.notifier.status(f"{'draining' if loop.draining else 'serving'} on {self.config.endpoint}: "
                                     f"{len(s.running)}/{s.max_batch} members, {len(s.waiting)} queued, "
                                     f"{loop.counters.accepted} accepted")
                last_status = now
        log.warning("second signal: exiting without draining")

    def _history(self, artifact) -> tuple[History | None, Recorder | None]:
        """The history thread over its SQLite file, and per-slot recordings when the policy needs audio.
        A history that cannot be opened (unwritable, a corrupt file with on_corrupt "refuse", no space)
        is no reason not to speak: the daemon serves without it, and says why (log, status, and the
        `error` a speak with a session gets)."""
        h = self.config.history
        self.history_error = ""
        try:
            store = open_store(self.config.history_path, h.on_corrupt)
            rates = VoiceRates(h.default_ms_per_unit, known=store.voice_rates())
            policy = make_policy(h.policy, rates=rates, guard_ms=h.guard_ms, asr_url=h.asr_url,
                                 asr_model=h.asr_model, asr_timeout_s=h.timeout_ms / 1000)
            history = History(store, policy, rates, context=zmq.Context.instance(), replies=REPLIES,
                              max_bytes=h.max_audio_bytes, timeout_s=h.timeout_ms / 1000, wait_s=h.wait_ms / 1000)
        except (sqlite3.Error, OSError) as exc:
            path = str(self.config.history_path)  # Corrupt names the file itself; SQLite's and OS errors may not
            self.history_error = str(exc) if path in str(exc) else f"{path}: {exc}"
            log.error("history unavailable, serving without it: %s", self.history_error)
            return None, None
        log.info("history: %s (policy %s)", store.path, h.policy)
        recorder = None
        if policy is not None and policy.requires_audio:
            recorder = Recorder(artifact.max_batch, h.max_reply_audio_ms * artifact.sample_rate // 1000)
        return history, recorder

    def _voices(self, artifact) -> VoiceService | None:
        """The voice thread, when the artifact has a clone encoder and its database opens; otherwise
        voice ops get `error` saying why (`no_voices`), and the daemon serves on."""
        v = self.config.voices
        self.no_voices = "this model cannot clone voices (its artifact has no clone encoder: export a Base checkpoint)"
        if not can_clone(artifact.graphs):
            return None
        try:
            store = VoiceStore(self.config.voices_path, artifact)
        except (sqlite3.Error, OSError) as exc:
            self.no_voices = f"enrolled voices unavailable ({self.config.voices_path}: {exc})"
            log.error("%s", self.no_voices)
            return None
        # ONNX Runtime whatever daemon.backend is: the voice thread runs it, and a TensorRT backend's
        # CUDA context is current on the loop's thread only
        encoder = VoiceEncoder(artifact, make_backend("onnxruntime", self.config.daemon.threads.clone_encoder),
                               max_ms=v.max_reference_ms)
        limits = Limits(v.max_voices, v.min_reference_ms, v.max_reference_ms, v.keep_reference)
        service = VoiceService(artifact, encoder, store, VoiceBook(), limits, context=zmq.Context.instance(),
                               replies=REPLIES)
        log.info("voices: %s (%d enrolled)", store.path, len(service.book.voices))
        return service

    def _voices_status(self) -> dict[str, Any]:
        if self.voices is None:
            return {"state": "off", "why": self.no_voices}
        return {"state": "on", **self.voices.status()}

    def _history_status(self) -> dict[str, Any]:
        if self.history is None:
            return {"state": "unavailable", "error": self.history_error, "path": str(self.config.history_path)}
        return self.history.snapshot

    def _portaudio(self) -> str | None:
        """Why there is no PortAudio, said once as a boot warning (the speaker and the microphone are
        then unavailable, and status says why); None when it loads, or no device is configured."""
        audio = self.config.audio
        if audio.device == "none" and audio.input_device == "none":
            return None
        why = missing()
        if why:
            log.warning("%s", why)
        return why

    def _speaker(self, artifact, core: Core) -> Speaker | None:
        """The local speaker, unless the config says device = "none" or there is no PortAudio."""
        audio = self.config.audio
        if audio.device == "none":
            return None
        replies = audio.max_replies or artifact.max_batch + self.config.daemon.queue_limit
        step_ms = -(-core.step_samples * 1000 // artifact.sample_rate)
        if audio.ahead_ms < step_ms:
            windows = "two vocoder windows" if core.worker.threaded else "one vocoder window"
            raise ConfigError(f"audio.ahead_ms must be >= {step_ms} ({windows}: the most audio one step hands a "
                              f"reply), got {audio.ahead_ms}")
        if self.no_portaudio:
            return None
        tap_s = 2.0 if audio.input_device != "none" and self.config.vad.echo_cancel else 0.0
        return Speaker(audio, artifact.sample_rate, replies, self.events, ended=lambda reply: None, tap_seconds=tap_s)

    def _listener(self) -> Listener | None:
        """The microphone (VAD, barge-in, `mic` events), unless the config says input_device = "none" or
        there is no PortAudio."""
        if self.config.audio.input_device == "none" or self.no_portaudio:
            return None
        try:
            listener = Listener(self.config.audio, self.config.vad, self.events, self.speaker,
                                mic_audio=self.config.events.mic_audio)
        except FileNotFoundError as exc:  # the VAD's model is not installed: serve on, without barge-in
            log.error("microphone disabled: %s", exc)
            self.listener_error = str(exc)
            return None
        if self.speaker is not None:
            self.speaker.before_rescan, self.speaker.after_rescan = listener.hold, listener.release
        return listener

    def _install_signals(self) -> None:
        def handle(signum, _frame) -> None:
            self.signals += 1

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handle)
            signal.signal(signal.SIGINT, handle)
