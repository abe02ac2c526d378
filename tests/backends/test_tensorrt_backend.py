"""The TensorRT backend's own code, run in CI against test doubles of `tensorrt` and `pycuda` that keep
their documented contracts (tests/support/fake_trt.py): plans built by `edged-engines plans` and
stamped; a stale plan refused with how to rebuild it; every shape and address checked (a refusal
names the tensor); the CUDA context pushed once and popped on close; and the backend synthesizing,
through its mapped buffers, exactly what the ONNX Runtime backend does. What this cannot show (real
kernels, fp16, speed on an Orin) is for scripts/validate_jetson.sh on a device.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import fake_trt

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer

ROOT = Path(__file__).resolve().parents[2]
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
    assert sorted(p.name for p in plans) == ["code_predictor.plan", "code_predictor_draft.plan", "codec_encoder.plan",
                                             "speaker_encoder.plan", "talker.plan", "vocoder.plan"]
    return out


def test_the_tensorrt_backend_synthesizes_what_onnxruntime_does(trt, artifact, backend):
    requests = [SpeechRequest(r.id, r.text, r.voice, r.language, sampling=Sampling(seed=i, cp_spec_verify_size=2),
                              dual_track=r.dual_track, max_frames=r.max_frames) for i, r in enumerate(REQUESTS)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(requests)
    trt_backend = trt.TrtBackend()
    assert fake_trt.stack_depth() == 1
    try:
        got = Synthesizer(load_artifact(artifact), trt_backend).synthesize(requests)
        executions = [[p.context.executions for p in e.profiles] for e in trt_backend.engines]
    finally:
        trt_backend.close()
    for w, g in zip(want, got):
        assert np.array_equal(w.frames, g.frames), w.id
        assert np.abs(w.pcm - g.pcm).max() <= 1e-5, w.id  # the double runs ONNX Runtime with its own threads
    # every engine ran through the TensorRT API (the draft graph: speculative verify is on); the talker on
    # both its profiles (prefills, decode steps)
    assert len(executions) == 4 and min(map(min, executions)) >= len(REQUESTS), executions


def test_the_clone_encoder_on_tensorrt_encodes_what_onnxruntime_does(trt, artifact, backend):
    """The built-in artifact's clone encoder (speaker and codec encoder plans, a reference of any
    length in their profile, and its own vocoder stream for the primed state) through the TensorRT
    API: the same x-vector, reference codes and primed state."""
    from edged.clone import VoiceEncoder

    t = np.arange(int(2.3 * 24000)) / 24000
    pcm = (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    want = VoiceEncoder(load_artifact(artifact), backend)
    want.preallocate()
    expected = want.encode(pcm, "the reference")
    trt_backend = trt.TrtBackend()
    try:
        got = VoiceEncoder(load_artifact(artifact), trt_backend)
        got.preallocate()
        voice = got.encode(pcm, "the reference")
        executions = [[p.context.executions for p in e.profiles] for e in trt_backend.engines]
    finally:
        trt_backend.close()
    assert np.abs(voice.xvector - expected.xvector).max() <= 1e-5 * np.abs(expected.xvector).max()
    assert voice.ref_codes is not None and np.array_equal(voice.ref_codes, expected.ref_codes)
    assert voice.primed is not None and expected.primed is not None  # the vocoder state after the reference
    assert all(np.abs(a - b).max() <= 1e-5 for a, b in zip(voice.primed, expected.primed))
    assert executions[:2] == [[1], [1]] and executions[2][0] >= -(-len(voice.ref_codes) // 4), executions


def test_close_releases_in_order_pops_the_context_once_and_is_idempotent(trt, artifact):
    backend = trt.TrtBackend()
    engine = backend.load(load_artifact(artifact).file("code_predictor"))
    buf = backend.empty((4, 8), np.float32)
    allocation = buf.base
    device = backend.device_empty((4, 8), np.float32)
    device_allocation = backend.device_memory[0]
    backend.close()
    assert fake_trt.stack_depth() == 0 and backend.cuda_context.detached
    assert not engine.profiles and engine.engine is None and allocation.freed and not backend.buffers
    assert device_allocation.freed and not backend.device_memory and device.nbytes == 128
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
    """A prefill longer than any profile admits, an address TensorRT refuses: errors naming the tensor."""
    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker, d, t = synth.core.talker, a.dims, a.max_seq + 1  # one row more than the context profile's maximum
        binds = {"inputs_embeds": backend.empty((1, t, d.hidden), np.float32), "positions": talker.prefill_position,
                 "slots": talker.slots[:1],
                 **talker.prefill_io}
        for i in range(d.layers):
            binds[f"past_keys_{i}"], binds[f"past_values_{i}"] = talker.no_keys, talker.no_values
            binds[f"new_keys_{i}"] = backend.device_empty((1, d.kv_heads, d.head_dim, t), np.float32)
            binds[f"new_values_{i}"] = backend.device_empty((1, d.kv_heads, t, d.head_dim), np.float32)
        with pytest.raises(EngineError, match=rf"talker\.onnx: no optimization profile of the plan admits "
                                              rf"inputs_embeds \[1, {t}, {d.hidden}\], positions \[1\]"):
            talker.engine.plan(binds, repeated=False)
        plan = synth.core.talker.verify_plans[0][1, 1]
        plan._addresses = [(n, addr + 16) if n == "inputs_embeds" else (n, addr) for n, addr in plan._addresses]
        with pytest.raises(EngineError, match=r"code_predictor\.onnx: TensorRT refused address 0x[0-9a-f]+ for "
                                              r"inputs_embeds "
                                              r"\(tensor addresses must be 256-byte aligned\)"):
            plan.bind()
    finally:
        backend.close()


def test_state_lives_in_device_memory_and_steps_replay_cuda_graphs(trt, artifact):
    """The KV cache, the new K/V rows and the vocoder state are device memory (the double maps it
    PROT_NONE, so a host read or write would have crashed the synthesis above); every step plan was
    captured at boot as a CUDA graph and steps launch graphs; a prefill plan is enqueued, not captured."""
    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker, vocoder = synth.core.talker, synth.core.vocoder
        device = [*talker.keys, *talker.values, *talker.new_keys, *talker.new_values, *talker.prefill_keys,
                  *talker.prefill_values, *talker.cp_keys, *talker.cp_values,
                  *(x for keys, values in talker.cp_new.values() for x in (*keys, *values)),
                  *talker.cp_hidden.values(), *talker.cp_draft_probs.values(), *talker.draft_probs.values(),
                  talker.draft_hidden,
                  *(x for side in vocoder.states for state in side for x in state)]
        assert all(isinstance(trt._allocation(x)[0], ctypes.Array) for x in device)
        host = [talker.hidden, talker.code0, talker.seen, talker.noise, talker.cp_codes[1], talker.cp_heads,
                *vocoder.pcm]
        assert not any(isinstance(trt._allocation(x)[0], ctypes.Array) for x in host)
        step_plans = [*(p for plans in talker.decode_plans for p in plans.values()),
                      *talker.predictor_plans,
                      *vocoder.plans.values()]
        assert all(p._graph is not None for p in step_plans)
        assert talker._prefill_plan(9)._graph is None
        libcuda = sys.modules["edged.backends.cuda_graph"].driver()
        before = libcuda.launches
        synth.synthesize([SpeechRequest("g", "Graphs replayed per step.", sampling=Sampling.greedy(), max_frames=10)])
        passes = a.dims.code_groups - 1
        assert libcuda.launches - before >= (passes + 1) * 10  # code-predictor passes and a decode per frame
    finally:
        backend.close()
    assert not libcuda.execs and not libcuda.graphs  # every graph destroyed on close


def test_a_failed_capture_is_logged_and_the_plan_enqueued(trt, artifact, backend, caplog):
    libcuda = sys.modules["edged.backends.cuda_graph"].driver()
    libcuda.cuStreamBeginCapture_v2 = lambda stream, mode: 900
    request = [SpeechRequest("f", "No graphs today.", sampling=Sampling.greedy(), max_frames=12)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(request)[0]
    trt_backend = trt.TrtBackend()
    try:
        with caplog.at_level("WARNING", logger="edged.tensorrt"):
            got = Synthesizer(load_artifact(artifact), trt_backend).synthesize(request)[0]
    finally:
        trt_backend.close()
    assert np.array_equal(want.frames, got.frames)
    assert "no CUDA graph for a plan (cuStreamBeginCapture failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900))" \
        in caplog.text


def test_the_host_cannot_touch_device_memory():
    """The double's device memory is what the device's is to the host: touching it kills the process."""
    code = ("import sys; sys.path.insert(0, 'tests/support'); import fake_trt, numpy as np, ctypes\n"
            "a = fake_trt.mem_alloc(4096)\n"
            "x = np.frombuffer((ctypes.c_byte * 4096).from_address(int(a)), dtype=np.uint8)\n"
            "fake_trt.memset_d8(int(a), 7, 4096)\n"
            "print('memset ok', flush=True)\n"
            "print(int(x[0]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout == "memset ok\n" and done.returncode == -signal.SIGSEGV, (done.stdout, done.stderr)


def test_the_doubles_keep_the_contracts(trt, artifact):
    """What the real libraries do, the doubles do: refuse misaligned addresses and shapes outside the
    profile, run nothing with a tensor unbound or without a current context, and count pushes."""
    runtime = fake_trt.Runtime(fake_trt.Logger())
    _, engine_bytes = json.loads("{}"), load_artifact(artifact).file("code_predictor").with_suffix(".plan").read_bytes()
    engine = runtime.deserialize_cuda_engine(engine_bytes.partition(b"\n")[2])
    ctx = engine.create_execution_context()
    assert ctx.set_tensor_address("positions", 256 * 7) and not ctx.set_tensor_address("positions", 256 * 7 + 8)
    assert ctx.set_input_shape("inputs_embeds", (2, 1, 64)) and not ctx.set_input_shape("inputs_embeds", (5, 1, 64))
    assert not ctx.set_input_shape("inputs_embeds", (2, 1, 65)) and not ctx.set_input_shape("inputs_embeds", (2, 4, 64))
    assert "positions" in ctx.infer_shapes()
    assert not ctx.execute_async_v3(0)  # no current context, unset tensors
    assert engine.num_optimization_profiles == 1 and not ctx.set_optimization_profile_async(1, 0)
    stream, graph = fake_trt.Stream(), ctypes.c_void_p()
    fake_trt.Context().push()
    try:
        for name in ctx.infer_shapes():
            shape = engine.get_tensor_profile_shape(name, 0)[2]  # the profile's largest, with 2 members
            shape[0] = 2 if engine.get_tensor_shape(name)[0] < 0 else shape[0]
            assert ctx.set_input_shape(name, shape)
        for i in range(engine.num_io_tensors):
            assert ctx.set_tensor_address(engine.get_tensor_name(i), 256 * (i + 1))
        libcuda = fake_trt.Driver()
        assert libcuda.cuStreamBeginCapture_v2(ctypes.c_void_p(stream.handle), 1) == 0
        assert not ctx.execute_async_v3(stream.handle)  # never enqueued with these bindings: no capture
        with pytest.raises(RuntimeError, match="STREAM_CAPTURE_UNSUPPORTED"):
            stream.synchronize()
        assert libcuda.cuStreamEndCapture(ctypes.c_void_p(stream.handle), ctypes.byref(graph)) == 0
        assert libcuda.graphs[graph.value] == []
    finally:
        fake_trt.Context.pop()
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


def test_a_quantized_artifact_is_built_strongly_typed_and_runs(trt, builtin_artifact, tmp_path):
    """An int4 twin in the Jetson form is built as strongly typed networks (TensorRT's explicit
    quantization: INT4-weight fp16 GEMMs) and serves a synthesis; fp32 is not strongly typed; a cpu-form
    twin is refused before anything is built, saying why."""
    from engines.quantize import quantize_artifact
    from engines.tensorrt import build_plans

    int4 = tmp_path / "int4"
    quantize_artifact(builtin_artifact, int4, "int4", "jetson", block=64)
    typed = {p.stem: json.loads(p.read_bytes().partition(b"\n")[2])["strongly_typed"] for p in build_plans(int4)}
    assert typed == {"talker": True, "code_predictor": True, "code_predictor_draft": True, "vocoder": True,
                     "speaker_encoder": True, "codec_encoder": True}
    fp32 = tmp_path / "fp32"
    shutil.copytree(builtin_artifact, fp32)
    assert not any(json.loads(p.read_bytes().partition(b"\n")[2])["strongly_typed"] for p in build_plans(fp32))
    cpu = tmp_path / "cpu"
    quantize_artifact(builtin_artifact, cpu, "int4")
    with pytest.raises(SystemExit, match="TensorRT 10.3 cannot build this artifact: its int4 weights are in the cpu form"):
        build_plans(cpu)
    assert not list(cpu.glob("*.plan"))
    backend = trt.TrtBackend()
    try:
        got = Synthesizer(load_artifact(int4), backend).synthesize(
            [SpeechRequest("q", "Four-bit weights.", sampling=Sampling.greedy(), max_frames=12)])[0]
    finally:
        backend.close()
    assert got.frames.shape[0] == 12 and np.isfinite(got.pcm).all()


def test_validate_jetson_compares_graphs_with_enqueues(trt, artifact):
    """The device acceptance run's CUDA-graph row, run through the doubles: the same frames both ways."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import validate_jetson
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    summary = validate_jetson.Summary()
    validate_jetson.cuda_graphs(artifact, "tensorrt", summary)
    (check, verdict, detail), = summary.rows
    assert (check, verdict) == ("CUDA graphs", "PASS") and detail.startswith("frames equal: True; per frame with graphs")
