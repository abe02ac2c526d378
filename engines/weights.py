"""Checkpoint weights as distributed, read one tensor at a time, and the module tensors made of them.

A checkpoint's weights are one `model.safetensors` or shards named by `model.safetensors.index.json`
(its `weight_map`), in bf16, fp16 or fp32. `Checkpoint` reads a tensor only when asked, through
`safe_open`, opened for that read alone (a shard's mapped pages never pile up in memory), and hands
it over as float32. `Weights` says where each tensor of a module comes from (one checkpoint key,
renamed, or several combined: Qwen3-Omni's experts, stacked) and is checked against the module's
shapes before anything is read. A module built with `fake` has shapes but no storage: the export
(engines/onnx.py) writes its graph from the shapes and asks `Weights` for each tensor as it
streams the graph's data to disk; `Weights.load` gives a module real tensors (for torch runs).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from engines.config import CheckpointError
from engines.registry import INDEX, SINGLE

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
"""Stored types read (as float32); any other is an error naming the tensor."""


class Checkpoint:
    """The safetensors weights of a checkpoint directory (or a sub-directory such as speech_tokenizer)."""

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        index, single = self.directory / INDEX, self.directory / SINGLE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no weight_map")
            # a shard is looked for when a tensor in it is read: a checkpoint fetched for one export
            # holds only the shards that export reads (engines/hub.py)
            self.files = {key: self.directory / name for key, name in weight_map.items()}
        elif single.is_file():
            with safe_open(str(single), framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), single)
        else:
            raise CheckpointError(f"{self.directory}: no {SINGLE} and no {INDEX}")
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def where(self, key: str) -> str:
        return f"{self.files[key].name}: {key!r}" if key in self.files else f"{self.directory}: {key!r}"

    def shape(self, key: str) -> tuple[int, ...]:
        return self._header(key)[1]

    def _header(self, key: str) -> tuple[str, tuple[int, ...]]:
        """(stored dtype, shape) of a tensor, from its shard's header (read once per shard)."""
        if key not in self.files:
            raise CheckpointError(f"{self.directory}: missing tensor {key!r}")
        if key not in self._meta:
            path = self.files[key]
            if not path.is_file():
                raise CheckpointError(f"{path}: named by {INDEX} but missing (it holds {key!r})")
            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys())  # a safetensors handle, not a dict
                for name in names:
                    part = f.get_slice(name)
                    self._meta[name] = (part.get_dtype(), tuple(part.get_shape()))
        dtype = self._meta[key][0]
        if dtype not in DTYPES:
            raise CheckpointError(f"{self.where(key)} is stored as {dtype}; this export reads {', '.join(DTYPES)}")
        return self._meta[key]

    def read(self, key: str, rows: slice | None = None) -> torch.Tensor:
        """A tensor (or `rows` of its first axis) as float32, read from its shard alone."""
        self._header(key)
        with safe_open(str(self.files[key]), framework="pt") as f:
            tensor = f.get_tensor(key) if rows is None else f.get_slice(key)[rows]
            return tensor.to(torch.float32, copy=True)


@dataclass(frozen=True)
class Source:
    """One tensor made of checkpoint tensors: each of `keys` stored with `shape`, combined by `make`
    (None: the one key as it is) into a tensor of shape `out`."""

    keys: tuple[str, ...]
    shape: tuple[int, ...]
    out: tuple[int, ...]
    make: Callable[[list[torch.Tensor]], torch.Tensor] | None = None


def renamed(key: str, shape: tuple[int, ...]) -> Source:
    return Source((key,), shape, shape)


def stacked(keys: list[str], shape: tuple[int, ...], transposed: bool) -> Source:
    """Tensors of one shape stacked on a new first axis (each transposed first when `transposed`)."""
    return Source(tuple(keys), shape, (len(keys), *(shape[::-1] if transposed else shape)),
                  lambda ts: torch.stack([t.T if transposed else t for t in ts]).contiguous())


def by_prefix(module: nn.Module, prefixes: dict[str, str], prefix: str = "") -> dict[str, Source]:
    """Each tensor of `module` from the checkpoint key its name maps to (module prefix -> checkpoint
    prefix, the first that matches), keyed `prefix + name`."""
    sources = {}
    for name, tensor in module.state_dict().items():
        rename = next((key + name[len(m):] for m, key in prefixes.items() if name.startswith(m)), None)
        if rename is None:
            raise KeyError(f"no checkpoint prefix maps the module's {name!r}")
        sources[prefix + name] = renamed(rename, tuple(tensor.shape))
    return sources


class Weights:
    """Where each tensor of a module comes from: `sources` by the module's state-dict name."""

    def __init__(self, checkpoint: Checkpoint, sources: dict[str, Source]):
        self.checkpoint = checkpoint
        self.sources = sources

    def check(self, modules: dict[str, nn.Module]) -> None:
        """Every tensor of each module (named under its prefix here) has a source of its shape, and
        every key a source reads (the host tables' too) is in the checkpoint with the shape it needs;
        raises naming the first that is not, before anything is read."""
        for prefix, module in modules.items():
            for name, tensor in module.state_dict().items():
                source = self.sources.get(prefix + name)
                if source is None:
                    raise KeyError(f"no checkpoint tensor is mapped to the module's {prefix + name!r}")
                if tuple(tensor.shape) != source.out:
                    raise ValueError(f"the module's {prefix + name!r} is {tuple(tensor.shape)}, its checkpoint "
                                     f"tensors {', '.join(source.keys[:2])}{', ...' if len(source.keys) > 2 else ''} "
                                     f"make {source.out}")
        for name, source in self.sources.items():
            for key in source.keys:
                if key not in self.checkpoint:
                    raise CheckpointError(f"{self.checkpoint.directory}: missing tensor {key!r} (for {name!r})")
                if self.checkpoint.shape(key) != source.shape:
                    raise CheckpointError(f"{self.checkpoint.where(key)} has shape {self.checkpoint.shape(key)}, "
                                     f"the config implies {source.shape}")

    def rows(self, name: str, rows: slice) -> torch.Tensor:
        """Rows of a renamed tensor, read alone (a large embedding in pieces)."""
        source = self.sources[name]
        assert source.make is None, name
        return self.checkpoint.read(source.keys[0], rows)

    def tensor(self, name: str) -> torch.Tensor:
        source = self.sources[name]
        parts = [self.checkpoint.read(key) for key in source.keys]
        return parts[0] if source.make is None else source.make(parts)

    def load(self, module: nn.Module, prefix: str = "") -> nn.Module:
        """`module` (built with `fake`, checked) with real tensors, read one at a time."""
        state = {name: self.tensor(prefix + name) for name in module.state_dict()}
        module.load_state_dict(state, strict=True, assign=True)
        return module.eval()


def fake(build: Callable[[], nn.Module]) -> nn.Module:
    """The module `build()` makes, with shapes but no storage (its tensors are fake)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        return build()


SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}


def write_safetensors(path: Path, tables: dict[str, tuple[tuple[int, ...], np.dtype, Iterable[np.ndarray]]]) -> None:
    """A safetensors file written as its tables are made: each (shape, dtype, chunks) yields its
    row-major data in consecutive chunks, so no table need be whole in memory."""
    header, offset = {}, 0
    for name, (shape, dtype, _) in tables.items():
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, (_, dtype, chunks) in tables.items():
            start = f.tell()
            for chunk in chunks:
                f.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())
            begin, end = header[name]["data_offsets"]
            if f.tell() - start != end - begin:
                raise RuntimeError(f"{path.name}: table {name!r} wrote {f.tell() - start} bytes, expected {end - begin}")
