"""Daemon configuration: a TOML file read once into frozen dataclasses.

Every key is validated at boot; an unknown key is an error naming it (a typo must never be
silently ignored on a device nobody is watching). Directories follow systemd's RUNTIME_DIRECTORY,
STATE_DIRECTORY and CONFIGURATION_DIRECTORY when they are set.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - JetPack 6 ships Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration that cannot be served; the message names the file and key."""


def runtime_dir() -> Path:
    """$RUNTIME_DIRECTORY under systemd, else $XDG_RUNTIME_DIR/edged, else a per-user temp dir."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "edged"
    import tempfile

    return Path(tempfile.gettempdir()) / f"edged-{os.getuid()}"


def state_dir() -> Path:
    """$STATE_DIRECTORY under systemd, else $XDG_STATE_HOME/edged (~/.local/state/edged)."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edged"


def default_config_path() -> Path | None:
    """$CONFIGURATION_DIRECTORY/edged.toml under systemd, when it exists."""
    if os.environ.get("CONFIGURATION_DIRECTORY"):
        path = Path(os.environ["CONFIGURATION_DIRECTORY"].split(":")[0]) / "edged.toml"
        return path if path.exists() else None
    return None


def default_endpoint() -> str:
    return f"ipc://{runtime_dir() / 'edged.sock'}"


@dataclass(frozen=True)
class ThreadPlan:
    """Engine threads per stage (ONNX Runtime's intra-op threads; TensorRT runs every stage on the GPU,
    on the loop's one CUDA stream, and reads none of them but clone_encoder). The defaults put
    generation and the vocoder on a core each of a 2-core CPU (measured in docs/dev/performance.md)."""

    generation: int = 1
    """The talker and its code predictor, on the cohort loop's thread."""
    vocoder: int = 1
    """The vocoder, on a thread of its own that decodes one step's windows while the next step
    computes. 0: no thread of its own; each window is decoded on the loop's thread, after its step."""
    clone_encoder: int = 1
    """The clone encoder (its own ONNX Runtime sessions on the voice thread, on every backend)."""

    @classmethod
    def parse(cls, text: str) -> ThreadPlan:
        """`generation=1,vocoder=1` (any of the stages; the others keep their defaults)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for part in text.split(","):
            stage, _, count = part.partition("=")
            stage = stage.strip()
            if stage not in known:
                raise ConfigError(f"threads: unknown stage {stage!r} (stages: {', '.join(sorted(known))}; "
                                  f"write STAGE=N[,STAGE=N...])")
            try:
                values[stage] = int(count)
            except ValueError:
                raise ConfigError(f"threads: {stage} must be an int, got {count.strip()!r}") from None
        plan = cls(**values)
        plan.check("threads")
        return plan

    def __str__(self) -> str:
        """As `parse` reads it."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def check(self, where: str) -> None:
        if self.generation < 1 or self.clone_encoder < 1 or self.vocoder < 0:
            raise ConfigError(f"{where}: generation and clone_encoder must be >= 1, vocoder >= 0 (0: on the loop's "
                              f"thread), got {self}")


@dataclass(frozen=True)
class DaemonConfig:
    listen: str = ""
    """ZeroMQ endpoint to bind (ipc:// or tcp://). Empty: ipc://<runtime dir>/edged.sock."""
    curve_secret_key: str = ""
    """The daemon's CURVE certificate (its .key_secret file): every tcp:// socket is a CURVE server."""
    curve_authorized_dir: str = ""
    """Directory of the client certificates (.key files) allowed to connect over tcp://."""
    insecure_tcp: bool = False
    """Listen on tcp:// without CURVE (anyone who can reach the port is served); logged at every boot."""
    artifact: str = ""
    """Artifact directory. Empty: the built-in tiny artifact."""
    backend: str = "onnxruntime"
    """Engine backend: onnxruntime (CPU) or tensorrt (Jetson)."""
    threads: ThreadPlan = field(default_factory=ThreadPlan)
    """Engine threads per stage: [daemon.threads] generation, vocoder, clone_encoder."""
    cuda_graphs: bool = True
    """tensorrt: replay each step's plans as CUDA graphs captured at boot (false: enqueue every run)."""
    queue_limit: int = 16
    """Requests waiting for a cohort slot before new ones are rejected with reason "busy"."""
    max_message_bytes: int = 2 << 20
    """Largest client message accepted (bytes); bigger ones get an `error` reply."""
    client_queue: int = 1000
    """Replies queued for one client (beyond its own receive queue) before it counts as not reading
    and its requests end ("client not reading")."""
    drain_timeout_s: float = 10.0
    """On SIGTERM: how long in-flight requests may run before they are cancelled."""
    first_text_timeout_ms: int = 120000
    """A streamed request (more_text) with no text yet (its speak's text and every `text` so far
    empty) ends with an error when none comes this long after it was accepted (a cold reasoning
    model may take minutes)."""
    text_timeout_ms: int = 10000
    """Once a streamed request has had text: when its next `text` is this late after the last one,
    its text is treated as final."""
    log_level: str = "info"
    """debug, info, warning or error."""
    test_stall_after_steps: int = 0
    """Testing aid: after this many cohort steps the loop hangs, so watchdog pings stop. 0 = off."""


@dataclass(frozen=True)
class VocoderConfig:
    chunk_frames: int = 4
    """Frames per vocoder window (and per streamed audio chunk) after the first."""
    first_chunk_frames: int = 1
    """Frames in the first window: small for a fast first audio chunk."""


@dataclass(frozen=True)
class AudioConfig:
    device: str = ""
    """Output device for local playback, matched as sounddevice matches names (a substring of the
    device name, or an index). Empty: PortAudio's default output. "none": no local playback."""
    input_device: str = ""
    """Microphone for barge-in and the `mic` events. Empty: PortAudio's default input. "none": no microphone."""
    barge_in: bool = True
    """User speech while a reply plays interrupts it."""
    on_missing_device: str = "silent"
    """What `play: true` does while there is no output device: "silent" (synthesize and stream, play
    nothing; the report says played_ms 0) or "reject"."""
    blocksize: int = 0
    """Frames per audio callback (0: the host's choice, lowest latency)."""
    latency_ms: float = 0.0
    """Suggested device latency in ms (0: PortAudio's "low")."""
    ring_ms: int = 2000
    """The speaker's ring (device-rate samples in flight to the callback), in ms."""
    ahead_ms: int = 10000
    """Generate-ahead buffer per reply, in ms of audio: a reply whose buffer is full pauses until
    the speaker drains it (later replies generate ahead while an earlier one plays). The reply
    playing now also has the speaker's ring: it runs at most ring_ms + ahead_ms ahead."""
    max_replies: int = 0
    """Replies that may hold a generate-ahead buffer at once (0: max_batch + daemon.queue_limit)."""
    playback_event_ms: int = 100
    """Period of `playback` events on the event socket while a reply plays."""
    lost_after_ms: int = 2000
    """A stream whose callback has not run for this long is lost: it is closed and reopened."""
    reopen_min_ms: int = 500
    """First delay before reopening a lost (or missing) device; doubles up to reopen_max_ms."""
    reopen_max_ms: int = 30000
    realtime_priority: int = 5
    """SCHED_FIFO priority the audio threads ask for (the speaker's feeder, the listener, PortAudio's
    callbacks): 1-99, below the audio server's own (JACK's default 10); refused, they ask for nice -10
    (edged/audio/scheduling.py). 0: ask for nothing. The unit allows up to 10 (LimitRTPRIO=10)."""


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.5
    """Speech probability that starts speech (silero VAD); speech stops below threshold - 0.15."""
    min_speech_ms: int = 64
    """Speech must last this long before it counts (a `vad` start event; a barge-in while playing)."""
    min_silence_ms: int = 300
    """Silence that ends speech (a `vad` stop event)."""
    echo_cancel: bool = True
    """Cancel the daemon's own voice (what it sent to the speaker) from the microphone before the VAD."""


@dataclass(frozen=True)
class EventsConfig:
    listen: str = ""
    """ZeroMQ PUB endpoint for events. Empty: ipc://<runtime dir>/edged-events.sock. "none": no events."""
    mic_audio: bool = True
    """Publish the microphone's audio (16 kHz s16le, echo-cancelled) as `mic` events."""


@dataclass(frozen=True)
class HistoryConfig:
    path: str = ""
    """SQLite file of every session's turns. Empty: <state dir>/history.sqlite3."""
    policy: str = "rate"
    """How an interrupted reply's heard text is estimated: rate | asr | none (all or nothing)."""
    wait_ms: int = 2000
    """`history` with wait: true waits at most this long for pending calibrations."""
    timeout_ms: int = 1000
    """One calibration run's deadline (asr: queue, HTTP and matching together)."""
    guard_ms: int = 160
    """Subtracted from played_ms before estimating (a word being spoken at the cut is not heard)."""
    default_ms_per_unit: float = 330.0
    """rate: milliseconds per text unit (a word, or a CJK character) before a voice's rate is learned."""
    max_audio_bytes: int = 8 << 20
    """asr: reply audio kept per session for calibration (whole replies, oldest evicted first)."""
    max_reply_audio_ms: int = 60000
    """asr: a reply longer than this is not recorded (its calibration keeps the default)."""
    asr_url: str = ""
    """asr: the full URL of an OpenAI-compatible transcription endpoint (http or https)."""
    asr_model: str = ""
    """asr: the `model` form field sent to it."""
    on_corrupt: str = "move"
    """A history file SQLite finds corrupt at boot: move (aside, as <file>.corrupt-<UTC time>, and
    start a fresh one) or refuse (serve without history until it is repaired)."""


@dataclass(frozen=True)
class VoicesConfig:
    """Enrolled voices (a Base artifact's clone encoder; other artifacts refuse voice_add)."""

    path: str = ""
    """SQLite file of the enrolled voices. Empty: <state dir>/voices.sqlite3."""
    max_voices: int = 32
    min_reference_ms: int = 1000
    max_reference_ms: int = 30000
    """The clone encoder's buffers are claimed at boot for this long a reference."""
    keep_reference: bool = False
    """Keep each reference recording in the database (by default only what the encoder made of it)."""


@dataclass(frozen=True)
class SamplingConfig:
    """Defaults for requests that do not say (empty: the artifact's generation defaults)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    cp_temperature: float | None = None
    cp_top_k: int | None = None
    cp_top_p: float | None = None
    cp_spec_verify_size: int | None = None
    """The code predictor's speculative verify window for requests that do not say: 0 = off, 2..8."""


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def with_overrides(self, *, artifact: str | None = None, listen: str | None = None,
                       audio_device: str | None = None, input_device: str | None = None) -> Config:
        daemon, audio = self.daemon, self.audio
        if artifact is not None:
            daemon = replace(daemon, artifact=artifact)
        if listen is not None:
            _check_endpoint(listen, "--listen", "daemon.listen")
            daemon = replace(daemon, listen=listen)
        if audio_device is not None:
            audio = replace(audio, device=audio_device)
        if input_device is not None:
            audio = replace(audio, input_device=input_device)
        return replace(self, daemon=daemon, audio=audio)

    @property
    def endpoint(self) -> str:
        return self.daemon.listen or default_endpoint()

    @property
    def tcp_endpoints(self) -> list[str]:
        return [e for e in (self.endpoint, self.events_endpoint) if e and e.startswith("tcp://")]

    @property
    def curve(self) -> bool:
        """Whether the daemon's tcp:// sockets are CURVE servers."""
        return bool(self.daemon.curve_secret_key and self.daemon.curve_authorized_dir)

    def security_problem(self) -> str | None:
        """Why this config must not be served as it is (tcp:// without CURVE), or None."""
        d = self.daemon
        if bool(d.curve_secret_key) != bool(d.curve_authorized_dir):
            return "daemon.curve_secret_key and daemon.curve_authorized_dir go together: set both, or neither"
        if not self.tcp_endpoints or self.curve or d.insecure_tcp:
            return None
        return (f"refusing to listen on {' and '.join(self.tcp_endpoints)} without CURVE: anyone who can reach the "
                f"port could make this device speak and listen to its microphone. Make keys with `edged keys init "
                f"DIR`, then set daemon.curve_secret_key = \"DIR/server.key_secret\" and daemon.curve_authorized_dir = "
                f"\"DIR/authorized\" (or set daemon.insecure_tcp = true to serve anyone who can reach it)")

    @property
    def history_path(self) -> Path:
        return Path(self.history.path) if self.history.path else state_dir() / "history.sqlite3"

    @property
    def voices_path(self) -> Path:
        return Path(self.voices.path) if self.voices.path else state_dir() / "voices.sqlite3"

    @property
    def events_endpoint(self) -> str | None:
        if self.events.listen == "none":
            return None
        return self.events.listen or f"ipc://{runtime_dir() / 'edged-events.sock'}"


def load_config(path: Path | str | None) -> Config:
    """Read and validate a TOML config; None (and no systemd config file) gives the defaults."""
    path = Path(path) if path is not None else default_config_path()
    if path is None:
        return Config()
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such config file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    return _build(Config, raw, str(path), "")


MOVED = {"voices.threads": "daemon.threads.clone_encoder"}
"""Keys that are now elsewhere: the error says where."""


def _build(cls, raw: dict[str, Any], source: str, prefix: str):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        key = f"{prefix}{unknown[0]}"
        where = f"moved to {MOVED[key]}" if key in MOVED else f"known: {', '.join(sorted(known))}"
        raise ConfigError(f"{source}: unknown key '{key}' ({where})")
    values = {}
    for name, value in raw.items():
        f = known[name]
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        key = f"{prefix}{name}"
        if is_dataclass(default):
            if not isinstance(value, dict):
                keys = ", ".join(sorted(x.name for x in fields(default)))
                raise ConfigError(f"{source}: [{key}] must be a table (keys: {keys}), got {value!r}")
            values[name] = _build(type(default), value, source, f"{key}.")
        else:
            values[name] = _check(value, str(f.type), source, key)
    config = cls(**values)
    _validate(config, source)
    return config


def _check(value, annotation: str, source: str, key: str):
    kinds: dict[str, Any] = {"str": str, "int": int, "float": (int, float), "bool": bool}
    base = annotation.replace(" | None", "")
    want = kinds.get(base)
    if want is None or isinstance(value, bool) and base != "bool" or not isinstance(value, want):
        raise ConfigError(f"{source}: {key} must be {base}, got {value!r}")
    return float(value) if base == "float" else value


def _check_endpoint(value: str, source: str, key: str, off: bool = False) -> None:
    """A ZeroMQ endpoint the daemon can bind: "" (the default), ipc://PATH or tcp://HOST:PORT (or
    "none" where `off`)."""
    if value == "" or (off and value == "none"):
        return
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("ipc", "tcp") or not rest:
        extra = ', or "none"' if off else ""
        raise ConfigError(f"{source}: {key} must be ipc://PATH or tcp://HOST:PORT{extra}, got {value!r}")


def _validate(config, source: str) -> None:
    if isinstance(config, EventsConfig):
        _check_endpoint(config.listen, source, "events.listen", off=True)
    if isinstance(config, DaemonConfig):
        _check_endpoint(config.listen, source, "daemon.listen")
        if config.backend not in ("onnxruntime", "tensorrt"):
            raise ConfigError(f"{source}: daemon.backend must be onnxruntime or tensorrt, got {config.backend!r}")
        if config.queue_limit < 0:
            raise ConfigError(f"{source}: daemon.queue_limit must be >= 0")
        if config.max_message_bytes < 1024:
            raise ConfigError(f"{source}: daemon.max_message_bytes must be >= 1024")
        if config.client_queue < 16:
            raise ConfigError(f"{source}: daemon.client_queue must be >= 16")
        if config.drain_timeout_s < 0:
            raise ConfigError(f"{source}: daemon.drain_timeout_s must be >= 0")
        if config.first_text_timeout_ms < 1:
            raise ConfigError(f"{source}: daemon.first_text_timeout_ms must be >= 1")
        if config.text_timeout_ms < 1:
            raise ConfigError(f"{source}: daemon.text_timeout_ms must be >= 1")
        if config.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"{source}: daemon.log_level must be debug, info, warning or error")
    if isinstance(config, ThreadPlan):
        config.check(f"{source}: daemon.threads")
    if isinstance(config, VocoderConfig) and (config.chunk_frames < 1 or config.first_chunk_frames < 1):
        raise ConfigError(f"{source}: vocoder.chunk_frames and vocoder.first_chunk_frames must be >= 1")
    if isinstance(config, AudioConfig):
        if config.on_missing_device not in ("silent", "reject"):
            raise ConfigError(f"{source}: audio.on_missing_device must be silent or reject")
        for name in ("blocksize", "max_replies"):
            if getattr(config, name) < 0:
                raise ConfigError(f"{source}: audio.{name} must be >= 0")
        for name in ("ring_ms", "ahead_ms", "playback_event_ms", "lost_after_ms", "reopen_min_ms", "reopen_max_ms"):
            if getattr(config, name) < 1:
                raise ConfigError(f"{source}: audio.{name} must be >= 1")
        if config.latency_ms < 0:
            raise ConfigError(f"{source}: audio.latency_ms must be >= 0")
        if not 0 <= config.realtime_priority <= 99:
            raise ConfigError(f"{source}: audio.realtime_priority must be 0 (off) to 99")
    if isinstance(config, VoicesConfig):
        if config.max_voices < 0:
            raise ConfigError(f"{source}: voices.max_voices must be >= 0")
        if not 100 <= config.min_reference_ms <= config.max_reference_ms <= 30000:
            raise ConfigError(f"{source}: voices.min_reference_ms and max_reference_ms must satisfy "
                              f"100 <= min <= max <= 30000")
    if isinstance(config, HistoryConfig):
        if config.policy not in ("rate", "asr", "none"):
            raise ConfigError(f"{source}: history.policy must be rate, asr or none, got {config.policy!r}")
        if config.on_corrupt not in ("move", "refuse"):
            raise ConfigError(f"{source}: history.on_corrupt must be move or refuse, got {config.on_corrupt!r}")
        if config.policy == "asr" and not (config.asr_url and config.asr_model):
            raise ConfigError(f"{source}: history.policy = \"asr\" needs history.asr_url and history.asr_model")
        for name in ("wait_ms", "timeout_ms", "max_audio_bytes", "max_reply_audio_ms"):
            if getattr(config, name) < 1:
                raise ConfigError(f"{source}: history.{name} must be >= 1")
        if config.guard_ms < 0 or config.default_ms_per_unit <= 0:
            raise ConfigError(f"{source}: history.guard_ms must be >= 0 and history.default_ms_per_unit > 0")
    if isinstance(config, VadConfig):
        if not 0.15 < config.threshold < 1:
            raise ConfigError(f"{source}: vad.threshold must be in (0.15, 1), got {config.threshold}")
        if config.min_speech_ms < 0 or config.min_silence_ms < 0:
            raise ConfigError(f"{source}: vad.min_speech_ms and vad.min_silence_ms must be >= 0")
