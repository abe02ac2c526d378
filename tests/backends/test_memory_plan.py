"""scripts/memory_plan.py against what the TensorRT backend claims on the doubles (tests/support/
fake_trt.py, fake_cuda.py) for the same artifact: every device byte the booted backend holds is a row
of the plan: the buffers and append tables (measured), the activation block, and the persistent
memory of each execution context, which the double charges per context as TensorRT does; the plan
counts the contexts the backend makes (one per captured graph, at most one per profile shared)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from support import fake_cuda, fake_trt

from edged.artifact import load_artifact
from edged.core import Core

ROOT = Path(__file__).resolve().parents[2]


def test_the_memory_plan_counts_every_device_byte_the_backend_claims(trt, builtin_artifact, tmp_path):
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    build_plans(art)
    a = load_artifact(art)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import memory_plan
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rows = memory_plan.plan(art, a.max_batch, a.max_seq, heads=4, intermediate=128)
    before = {id(r) for r in fake_cuda._regions}  # what other tests in this process still hold
    backend = trt.TrtBackend()
    try:
        Core(a, backend).preallocate()
        contexts = [c.context for e in backend.engines for c in e.contexts()]
        device = [r for r in fake_cuda._regions if r.device and id(r) not in before]
        held = sum(r.size for r in device)
        graphs, activations = backend.graphs(), backend.activation_bytes()
    finally:
        backend.close()
    (label, (context_mib, _)), = [(k, v) for k, v in rows.items() if k.startswith("execution contexts")]
    own, shared = map(int, re.fullmatch(r"execution contexts \((\d+) graphs' own \+ at most (\d+) shared\)",
                                        label).groups())
    assert own == graphs and graphs < len(contexts) <= own + shared
    persistent = len(contexts) * fake_trt.CONTEXT_BYTES
    assert context_mib * 2**20 >= persistent  # the plan's estimate covers what each context holds
    buffers = rows["KV cache, K/V scratch, predictor heads and scratch, vocoder state"][0] + \
        rows["K/V append tables (every prefill length's)"][0]
    rest = held - persistent - activations  # what the plan measures: buffers and tables
    assert abs(rest / 2**20 - buffers) * 2**20 <= len(device) * fake_cuda.PAGE, (rest / 2**20, buffers)
