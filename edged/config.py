"""Daemon configuration: a TOML file read once into frozen dataclasses.

Every key is validated at boot; an unknown key is an error naming it (a typo must never be
silently ignored on a device nobody is watching). Directories follow systemd's RUNTIME_DIRECTORY,
STATE_DIRECTORY and CONFIGURATION_DIRECTORY when they are set.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields, replace
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
class DaemonConfig:
    listen: str = ""
    """ZeroMQ endpoint to bind (ipc:// or tcp://). Empty: ipc://<runtime dir>/edged.sock."""
    artifact: str = ""
    """Artifact directory. Empty: the built-in tiny artifact."""
    backend: str = "onnxruntime"
    """Engine backend: onnxruntime (CPU) or tensorrt (Jetson)."""
    threads: int = 0
    """Engine threads (0: all cores)."""
    queue_limit: int = 16
    """Requests waiting for a cohort slot before new ones are rejected with reason "busy"."""
    max_message_bytes: int = 1 << 20
    """Largest client message accepted (bytes); bigger ones get an `error` reply."""
    drain_timeout_s: float = 10.0
    """On SIGTERM: how long in-flight requests may run before they are cancelled."""
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
    """Output device name for local playback. Empty: the system default."""
    on_missing_device: str = "silent"
    """What `play: true` does when there is no audio device: "silent" (synthesize, play nothing) or "reject"."""


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


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def with_overrides(self, *, artifact: str | None = None, listen: str | None = None) -> Config:
        daemon = self.daemon
        if artifact is not None:
            daemon = replace(daemon, artifact=artifact)
        if listen is not None:
            daemon = replace(daemon, listen=listen)
        return replace(self, daemon=daemon)

    @property
    def endpoint(self) -> str:
        return self.daemon.listen or default_endpoint()


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


def _build(cls, raw: dict[str, Any], source: str, prefix: str):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown key '{prefix}{unknown[0]}' (known: {', '.join(sorted(known))})")
    values = {}
    for name, value in raw.items():
        f = known[name]
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        key = f"{prefix}{name}"
        if hasattr(default, "__dataclass_fields__"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{key}] must be a table")
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


def _validate(config, source: str) -> None:
    if isinstance(config, DaemonConfig):
        if config.backend not in ("onnxruntime", "tensorrt"):
            raise ConfigError(f"{source}: daemon.backend must be onnxruntime or tensorrt, got {config.backend!r}")
        if config.queue_limit < 0 or config.threads < 0:
            raise ConfigError(f"{source}: daemon.queue_limit and daemon.threads must be >= 0")
        if config.max_message_bytes < 1024:
            raise ConfigError(f"{source}: daemon.max_message_bytes must be >= 1024")
        if config.drain_timeout_s < 0:
            raise ConfigError(f"{source}: daemon.drain_timeout_s must be >= 0")
        if config.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"{source}: daemon.log_level must be debug, info, warning or error")
    if isinstance(config, VocoderConfig) and (config.chunk_frames < 1 or config.first_chunk_frames < 1):
        raise ConfigError(f"{source}: vocoder.chunk_frames and vocoder.first_chunk_frames must be >= 1")
    if isinstance(config, AudioConfig) and config.on_missing_device not in ("silent", "reject"):
        raise ConfigError(f"{source}: audio.on_missing_device must be silent or reject")
