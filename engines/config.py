"""Checkpoint configs read strictly: every model-defining value from a key the family's reader names.

Checkpoints reach users as their library wrote them: transformers 4.57 (the version qwen-tts 0.1.1
pins, and the one the published checkpoints were saved with) or a re-save under transformers 5.x,
which names some keys differently. A family's reader (`engines/<family>/config.py`) lists each
value it reads with the name each layout gives it; a value under none of them is a `ConfigError`
naming the key and the file, never a default. The two layouts differ, for the configs read here, in:

    RoPE      4.57: `rope_theta`, and `rope_scaling` {rope_type (or legacy `type`), mrope_section,
                    interleaved} or null for plain RoPE
              5.x:  `rope_parameters` {rope_type, rope_theta, mrope_section, interleaved}
    experts   4.57: `num_experts`;  5.x: `num_local_experts` (Qwen3-Omni's MoE configs)

A value the library itself derives when its key is absent is derived the same way here and named
(`head_dim` of a stack whose config class has no such key: hidden_size // num_attention_heads, as
the attention reads `getattr(config, "head_dim", ...)`): that is the model's definition, not a guess.
Where the config class has a default of its own (the code predictors' head_dim = 128), the key must
be given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ABSENT = object()


class ConfigError(ValueError):
    """A checkpoint config that cannot be exported as it is; the message names the file and the key."""


class CheckpointError(ValueError):
    """A checkpoint's weight files or tensors are not what its index or config say; the message names
    the file and the tensor."""


@dataclass(frozen=True)
class Section:
    """One object of a config file: `file` for messages, `where` the key path to it."""

    values: dict
    file: str
    where: str = ""

    @classmethod
    def read(cls, path: Path) -> Section:
        if not path.is_file():
            raise ConfigError(f"{path}: missing from the checkpoint")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: the top level must be an object")
        return cls(values, str(path))

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self.values

    def need(self, name: str, kind: type | tuple[type, ...] = int, *, alias: str | None = None) -> Any:
        """The value of `name` (or of `alias`, the other layout's name for it), of type `kind`."""
        names = (name,) if alias is None else (name, alias)
        found = [n for n in names if n in self.values]
        if not found:
            raise ConfigError(f"{self.file}: missing key {' or '.join(repr(self.key(n)) for n in names)}")
        if len(found) == 2 and self.values[name] != self.values[alias]:
            raise ConfigError(f"{self.file}: {self.key(name)!r} and {self.key(alias)!r} disagree "
                              f"({self.values[name]!r}, {self.values[alias]!r})")
        return _typed(self.values[found[0]], kind, self.file, self.key(found[0]))

    def section(self, name: str, *, nullable: bool = False) -> Section:
        """The object at `name` (an empty one where `nullable` and the value is null)."""
        value = self.need(name, (dict, type(None)) if nullable else dict)
        return Section(value or {}, self.file, self.key(name))

    def mapping(self, name: str) -> dict[str, int]:
        """A name -> id table (speakers, languages): the key must be present; null means none."""
        table = self.section(name, nullable=True)
        return {k.lower(): table.need(k) for k in table.values}

    def expect(self, name: str, supported: Any) -> None:
        """A setting this port implements one way only: the key must be present and hold that value."""
        value = self.need(name, object)
        if value != supported:
            raise ConfigError(f"{self.file}: {self.key(name)}={value!r} is not supported (only {supported!r})")


def _typed(value: Any, kind: type | tuple[type, ...], file: str, key: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if int in kinds and bool not in kinds and isinstance(value, bool):
        raise ConfigError(f"{file}: {key!r} must be an integer, got {value!r}")
    if not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ConfigError(f"{file}: {key!r} must be {names}, got {value!r}")
    return value


@dataclass(frozen=True)
class Rope:
    theta: float
    sections: tuple[int, ...]
    """Multimodal RoPE sections (temporal, height, width), summing to head_dim / 2; empty for plain
    RoPE. Text positions repeat one row in all three, which makes M-RoPE plain 1-D RoPE: the
    sections are read and checked, and the graphs need only theta."""


def read_rope(s: Section, head_dim: int, *, multimodal: bool) -> Rope:
    """RoPE of one stack from either layout; only the default (unscaled) rotation is supported."""
    if s.has("rope_parameters"):  # transformers 5.x
        params = s.section("rope_parameters")
        theta, rope_type = params.need("rope_theta", float), params.need("rope_type", str)
        if s.has("rope_theta") and s.need("rope_theta", float) != theta:  # a custom class may keep both
            raise ConfigError(f"{s.file}: {s.key('rope_theta')} and {params.key('rope_theta')} disagree")
    else:  # transformers 4.57
        theta = s.need("rope_theta", float)
        # a stack without rope_scaling (code2wav) rotates plainly, as the library reads it
        params = s.section("rope_scaling", nullable=True) if s.has("rope_scaling") or multimodal else Section({}, s.file)
        rope_type = params.need("rope_type", str, alias="type") if params.values else "default"
    if rope_type != "default":
        raise ConfigError(f"{s.file}: {params.key('rope_type')}={rope_type!r} is not supported (only 'default')")
    if not multimodal:
        return Rope(theta, ())
    sections = tuple(params.need("mrope_section", list))
    if not all(isinstance(n, int) and n >= 0 for n in sections) or 2 * sum(sections) != head_dim:
        raise ConfigError(f"{s.file}: {params.key('mrope_section')}={list(sections)} must be counts summing to "
                          f"head_dim / 2 ({head_dim // 2})")
    return Rope(theta, sections)


def head_dim(s: Section, *, derived: bool = True) -> int:
    """`head_dim`; where the key is absent, hidden_size // num_attention_heads if `derived` (a config
    class without the key: the library's attention derives it so), else an error naming the key (a
    class with a default of its own: the code predictors' say 128 whatever the sizes)."""
    if s.has("head_dim") or not derived:
        return s.need("head_dim")
    return s.need("hidden_size") // s.need("num_attention_heads")


@dataclass(frozen=True)
class StackConfig:
    """One decoder-only transformer stack (talker or code predictor)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    rope_sections: tuple[int, ...]
    """M-RoPE sections (the talkers), empty for plain RoPE: see `Rope`."""


def stack_config(s: Section, *, multimodal: bool) -> StackConfig:
    """A stack from its config section (`multimodal`: the talker, whose RoPE has M-RoPE sections; the
    other stack is a code predictor, whose head_dim must be given)."""
    for name, supported in (("hidden_act", "silu"), ("attention_bias", False), ("sliding_window", None)):
        s.expect(name, supported)
    heads, kv_heads, dim = s.need("num_attention_heads"), s.need("num_key_value_heads"), head_dim(s, derived=multimodal)
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or dim <= 0:
        raise ConfigError(f"{s.file}: {s.key('num_attention_heads')}={heads} must be a positive multiple of "
                          f"{s.key('num_key_value_heads')}={kv_heads}, and head_dim ({dim}) positive")
    rope = read_rope(s, dim, multimodal=multimodal)
    return StackConfig(hidden=s.need("hidden_size"), layers=s.need("num_hidden_layers"), heads=heads,
                       kv_heads=kv_heads, head_dim=dim, intermediate=s.need("intermediate_size"),
                       rms_eps=s.need("rms_norm_eps", float), rope_theta=rope.theta, rope_sections=rope.sections)


@dataclass(frozen=True)
class MoEConfig:
    """A sparse mixture-of-experts MLP with a gated shared expert (Qwen3-Omni's talker)."""

    experts: int
    top_k: int
    expert_width: int
    shared_width: int
    norm_topk_prob: bool
