"""Every bound buffer view starts on a 256-byte boundary (TensorRT 10 refuses any other tensor
address), plans bind every tensor of their engine, and a backend closes idempotently: for the backend
under test (ONNX Runtime here; tensorrt on a device, EDGED_TEST_BACKEND)."""

from __future__ import annotations

import numpy as np
import pytest

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.backends.base import ALIGNMENT
from edged.core import Core
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer


def all_plans(core: Core) -> list:
    t, v = core.talker, core.vocoder
    prefills = [t._prefill_plan(n) for n in (1, 7, 33, core.artifact.max_seq - 1)]
    decodes = [p for plans in t.decode_plans for p in plans.values()]
    return [*decodes, *t.predictor_plans, *prefills, *v.plans.values()]


def test_every_bound_view_is_aligned_and_every_tensor_bound(builtin_artifact, backend):
    core = Core(load_artifact(builtin_artifact), backend)
    core.preallocate()
    for slot in range(core.artifact.max_batch):  # a request in every slot: per-slot views are in use
        core.prepare(SpeechRequest(f"r{slot}", "Aligned everywhere.", sampling=Sampling(seed=slot)), slot)
    plans = all_plans(core)
    assert len(plans) > 2 * core.artifact.max_batch
    engines = [core.talker.engine, core.talker.cp_engine, core.talker.draft_engine, core.vocoder.engine]
    names = {frozenset([*e.inputs, *e.outputs]) for e in engines}
    for plan in plans:
        assert frozenset(plan.bindings) in names
        for name, buf in plan.bindings.items():
            assert buf.ctypes.data % ALIGNMENT == 0, f"{name} at {buf.ctypes.data:#x}"


def test_a_misaligned_view_is_refused_at_bind_time_naming_the_tensor(builtin_artifact, backend):
    talker = Synthesizer(load_artifact(builtin_artifact), backend).core.talker
    bufs = dict(talker.verify_plans[0][1, 1].bindings)
    talker.cp_engine.plan(bufs)
    with pytest.raises(EngineError, match=r"code_predictor\.onnx: buffer for positions starts at an address that is "
                                          r"not a multiple of 256 bytes"):
        talker.cp_engine.plan({**bufs, "positions": backend.empty((3,), np.int64)[1:2]})


def test_backend_close_is_idempotent():
    from edged.backends import make_backend

    backend = make_backend("onnxruntime", threads=1)
    backend.empty((4,), np.float32)
    backend.close()
    backend.close()
