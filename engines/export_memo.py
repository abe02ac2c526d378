"""Exports kept by what they are made from, where EDGED_EXPORT_MEMO names a directory (off otherwise).

The test suite exports the same vocoder many times over: checkpoints of one shape variant share
their speech tokenizer, so their vocoder graphs are the same bytes (an export is deterministic:
engines.onnx.save_program). With EDGED_EXPORT_MEMO set, a graph is traced once per key, a hash of
everything its export reads (the module's class, parameters and buffers, its config, the example's
shapes, the options, and this package's source and torch's version), and a later export of the
same key copies the kept file; the caller's own checks still run on the copy. A user's export
always traces (docs/dev/tests.md).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENV = "EDGED_EXPORT_MEMO"


@functools.cache
def _code() -> bytes:
    """This package's source and torch's version: a kept graph is never reused by other code."""
    import torch

    h = hashlib.sha256(torch.__version__.encode())
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(path.read_bytes())
    return h.digest()


def key(module: torch.nn.Module, *parts: object) -> str:
    """The hash of `module` (its class, every parameter and buffer: name, dtype, shape, bytes) and
    the reprs of `parts` (config, shapes, options)."""
    import torch

    h = hashlib.sha256(_code())
    h.update(type(module).__qualname__.encode())
    for part in parts:
        h.update(repr(part).encode() + b"\0")
    tensors: Iterable[tuple[str, torch.Tensor]] = [*module.named_parameters(), *module.named_buffers()]
    for name, t in sorted(tensors, key=lambda nt: nt[0]):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def exported(memo_key: str, out: Path, export: Callable[[Path], None]) -> None:
    """`export(out)`, or the file kept under `memo_key` copied to `out` (see the module's note)."""
    memo = os.environ.get(ENV)
    if not memo:
        export(out)
        return
    kept = Path(memo) / f"{memo_key}.onnx"
    if kept.exists():
        shutil.copyfile(kept, out)
        return
    export(out)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
    shutil.copyfile(out, partial)
    os.replace(partial, kept)  # whole or absent: a worker exporting the same key at once writes the same bytes
