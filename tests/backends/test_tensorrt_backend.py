"""The TensorRT backend's own code, run in CI against test doubles of `tensorrt` and `pycuda` that keep
their documented contracts (tests/support/fake_trt.py): plans built by `edged-engines plans` and
stamped; a stale plan refused with how to rebuild it; every shape and address checked (a refusal
names the tensor); the CUDA context pushed once and popped on close; and the backend synthesizing,
through its mapped buffers, exactly what the ONNX Runtime backend does. What this cannot show (real
kernels, fp16, speed on an Orin) is for scripts/validate_jetson.sh on a device.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support import fake_trt

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

REQUESTS = [
    SpeechRequest("a", "The first sentence of the batch.", voice="vivian", language="english", max_frames=18),
    SpeechRequest("b", "你好，这是第二句。", voice="eric", language="chinese", max_frames=30),
    SpeechRequest("c", "A third one, with the dual track.", voice="ryan", dual_track=True, max_frames=24),
    SpeechRequest("d", "Fourth: no voice, no language at all.", max_frames=12),
    SpeechRequest("e", "Fifth joins when a slot frees up.", voice="aiden", language="french", max_frames=20),
]


@pytest.fixture
def trt(monkeypatch):
    fake_trt.install(monkeypatch)
    from edged.backends import tensorrt

    yield tensorrt
    assert fake_trt.stack_depth() == 0, "a CUDA context was left pushed: pycuda aborts at exit"


@pytest.fixture
def artifact(trt, builtin_artifact, tmp_path):
    from engines.tensorrt import build_plans

    out = tmp_path / "art"
    shutil.copytree(builtin_artifact, out)
    plans = build_plans(out, chunk_frames=4, first_chunk_frames=1)
    assert sorted(p.name for p in plans) == ["code_predictor.plan", "talker_decode.plan", "talker_prefill.plan",
                                             "vocoder.plan"]
    return out


def test_the_tensorrt_backend_synthesizes_what_onnxruntime_does(trt, artifact, backend):
    requests = [SpeechRequest(r.id, r.text, r.voice, r.language, sampling=Sampling(seed=i), dual_track=r.dual_track,
                              max_frames=r.max_frames) for i, r in enumerate(REQUESTS)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(requests)
    trt_backend = trt.TrtBackend()
    assert fake_trt.stack_depth() == 1
    try:
        got = Synthesizer(load_artifact(artifact), trt_backend).synthesize(requests)
        executions = [e.context.executions for e in trt_backend.engines]
    finally:
        trt_backend.close()
    for w, g in zip(want, got):
        assert np.array_equal(w.frames, g.frames), w.id
        assert np.abs(w.pcm - g.pcm).max() <= 1e-5, w.id  # the double runs ONNX Runtime with its own threads
    assert len(executions) == 4 and min(executions) >= len(REQUESTS)  # every engine ran, through the TensorRT API


def test_close_releases_in_order_pops_the_context_once_and_is_idempotent(trt, artifact):
    backend = trt.TrtBackend()
    engine = backend.load(load_artifact(artifact).file("code_predictor"))
    buf = backend.empty((4, 8), np.float32)
    allocation = buf.base
    backend.close()
    assert fake_trt.stack_depth() == 0 and backend.cuda_context.detached
    assert engine.context is None and allocation.freed and not backend.buffers
    backend.close()  # idempotent: no second pop
    assert fake_trt.stack_depth() == 0


def test_a_stale_plan_is_refused_with_how_to_rebuild(trt, artifact, monkeypatch):
    onnx_path = load_artifact(artifact).file("vocoder")
    plan = onnx_path.with_suffix(".plan")
    monkeypatch.setattr(fake_trt, "__version__", "10.4.0")
    monkeypatch.setattr(trt.trt, "__version__", "10.4.0")
    backend = trt.TrtBackend()
    try:
        with pytest.raises(EngineError, match=r"vocoder\.plan: built by TensorRT 10\.3\.0\.fake, this is TensorRT "
                                              r"10\.4\.0 \(rebuild the plans on this device: edged-engines plans"):
            backend.load(onnx_path)
        head, _, engine = plan.read_bytes().partition(b"\n")
        header = json.loads(head) | {"tensorrt": "10.4.0", "onnx_sha256": "0" * 64}
        plan.write_bytes(json.dumps(header).encode() + b"\n" + engine)
        with pytest.raises(EngineError, match=r"vocoder\.plan: built from another vocoder\.onnx than the artifact's"):
            backend.load(onnx_path)
        plan.write_bytes(b"a plan from somewhere else")
        with pytest.raises(EngineError, match=r"vocoder\.plan: not a plan written by edged-engines plans"):
            backend.load(onnx_path)
        plan.unlink()
        with pytest.raises(EngineError, match=r"vocoder\.plan: no TensorRT plan"):
            backend.load(onnx_path)
    finally:
        backend.close()


def test_a_refused_shape_or_address_names_the_tensor(trt, artifact):
    """The backend checks every setter: a prefill longer than the profile, an address TensorRT refuses."""
    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker, d, t = synth.core.talker, a.dims, a.max_seq + 1  # one row more than the profile's maximum
        binds = {"inputs_embeds": backend.empty((1, t, d.hidden), np.float32), **talker.prefill_io}
        for i in range(d.layers):
            binds[f"new_keys_{i}"] = backend.empty((1, d.kv_heads, d.head_dim, t), np.float32)
            binds[f"new_values_{i}"] = backend.empty((1, d.kv_heads, t, d.head_dim), np.float32)
        with pytest.raises(EngineError, match=rf"talker_prefill\.onnx: TensorRT refused shape \[1, {t}, {d.hidden}\] "
                                              r"for inputs_embeds \(outside the plan's optimization profile"):
            talker.prefill_engine.plan(binds)
        plan = synth.core.talker.cp_plans[0]
        plan._addresses = [(n, addr + 16) if n == "hidden" else (n, addr) for n, addr in plan._addresses]
        plan._engine.current = None
        with pytest.raises(EngineError, match=r"code_predictor\.onnx: TensorRT refused address 0x[0-9a-f]+ for hidden "
                                              r"\(tensor addresses must be 256-byte aligned\)"):
            plan.run()
    finally:
        backend.close()


def test_the_doubles_keep_the_contracts(trt, artifact):
    """What the real libraries do, the doubles do: refuse misaligned addresses and shapes outside the
    profile, run nothing with a tensor unbound or without a current context, and count pushes."""
    runtime = fake_trt.Runtime(fake_trt.Logger())
    _, engine_bytes = json.loads("{}"), load_artifact(artifact).file("code_predictor").with_suffix(".plan").read_bytes()
    engine = runtime.deserialize_cuda_engine(engine_bytes.partition(b"\n")[2])
    ctx = engine.create_execution_context()
    assert ctx.set_tensor_address("hidden", 256 * 7) and not ctx.set_tensor_address("hidden", 256 * 7 + 8)
    assert ctx.set_input_shape("hidden", (2, 64)) and not ctx.set_input_shape("hidden", (5, 64))
    assert not ctx.set_input_shape("hidden", (2, 65))
    assert "code0" in ctx.infer_shapes()
    assert not ctx.execute_async_v3(0)  # no current context, unset tensors
    with pytest.raises(RuntimeError, match="no current context"):
        fake_trt.Context.pop()


def test_an_fp16_artifact_is_built_strongly_typed_and_runs(trt, builtin_artifact, tmp_path, backend):
    from engines.fp16 import convert_artifact
    from engines.tensorrt import build_plans

    fp16 = tmp_path / "fp16"
    convert_artifact(builtin_artifact, fp16)
    plans = build_plans(fp16)
    assert all(json.loads(p.read_bytes().partition(b"\n")[0])["fp16"] is True for p in plans)
    request = [SpeechRequest("h", "Half precision weights, fp32 islands.", sampling=Sampling.greedy(), max_frames=20)]
    want = Synthesizer(load_artifact(fp16), backend).synthesize(request)[0]
    trt_backend = trt.TrtBackend()
    try:
        got = Synthesizer(load_artifact(fp16), trt_backend).synthesize(request)[0]
    finally:
        trt_backend.close()
    assert np.array_equal(want.frames, got.frames)
