"""The TensorRT backend's own code, run in CI against test doubles of `tensorrt`, `pycuda` and the
CUDA driver that keep their documented contracts and refuse what they refuse (tests/support/fake_trt.py,
fake_cuda.py: asynchronous streams, device memory the host cannot touch, TensorRT 10.3's builder
and runtime rules): plans built by `edged-engines plans` and stamped; a stale plan refused with how to
rebuild it; every shape and address checked (a refusal names the tensor); one activation block for
every context; K/V appends inside the steps' CUDA graphs; the CUDA context pushed once and popped on
close; and the backend synthesizing, through its mapped buffers, exactly what the ONNX Runtime backend
does. What this cannot show (real kernels, fp16 and INT4 numerics, memory sizes and speed on an Orin)
is for scripts/validate_jetson.sh on a device.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import fake_cuda, fake_trt, fake_trt_build

from edged.artifact import load_artifact
from edged.backends import EngineError
from edged.backends import kernels as edged_kernels
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
def artifact(trt, builtin_artifact, tmp_path):
    from engines.tensorrt import build_plans

    out = tmp_path / "art"
    shutil.copytree(builtin_artifact, out)
    plans = build_plans(out, chunk_frames=4, first_chunk_frames=1)
    assert sorted(p.name for p in plans) == ["code_predictor.plan", "code_predictor_draft.plan", "talker.plan",
                                             "vocoder.plan"]
    return out


def executions(backend) -> list[list[int]]:
    """Enqueues each engine ran per optimization profile, over all of its contexts (shared and each
    captured graph's own)."""
    return [[sum(c.context.executions for c in e.contexts() if c.index == i) for i in e.profiles]
            for e in backend.engines]


def test_the_tensorrt_backend_synthesizes_what_onnxruntime_does(trt, artifact, backend):
    requests = [SpeechRequest(r.id, r.text, r.voice, r.language, sampling=Sampling(seed=i, cp_spec_verify_size=2),
                              dual_track=r.dual_track, max_frames=r.max_frames) for i, r in enumerate(REQUESTS)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(requests)
    trt_backend = trt.TrtBackend()
    assert fake_trt.stack_depth() == 1
    try:
        got = Synthesizer(load_artifact(artifact), trt_backend).synthesize(requests)
        ran = executions(trt_backend)
    finally:
        trt_backend.close()
    for w, g in zip(want, got):
        assert np.array_equal(w.frames, g.frames), w.id
        assert np.abs(w.pcm - g.pcm).max() <= 1e-5, w.id  # the double runs ONNX Runtime with its own threads
    # every engine ran through the TensorRT API (the draft graph: speculative verify is on); the talker on
    # both its profiles (prefills, decode steps)
    assert len(ran) == 4 and min(map(min, ran)) >= len(REQUESTS), ran


def engine_of(plan: Path):
    """What the double built into a plan (its build facts: strongly typed, TF32, fp32 INT4 products)."""
    return fake_trt.Runtime(fake_trt.Logger()).deserialize_cuda_engine(plan.read_bytes().partition(b"\n")[2])


def test_close_waits_for_the_stream_releases_in_order_pops_the_context_once_and_is_idempotent(trt, artifact):
    backend = trt.TrtBackend()
    engine = backend.load(load_artifact(artifact).file("code_predictor"))
    buf = backend.empty((4, 8), np.float32)
    allocation = buf.base
    device = backend.device_empty((4, 8), np.float32)
    device_allocation = backend.device_memory[0]
    backend.claim_activations()
    activations = backend.activations
    backend.copy(device, buf)  # still pending: close() waits for it before freeing what it uses
    backend.close()
    assert fake_trt.stack_depth() == 0 and backend.cuda_context.detached
    assert not engine.shared and not engine.captured and engine.engine is None and allocation.freed
    assert not backend.buffers
    assert device_allocation.freed and not backend.device_memory and device.nbytes == 128 and activations.freed
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
        header = json.loads(head) | {"tensorrt": "10.4.0"}
        header["built_from"][0]["size"] += 1
        plan.write_bytes(json.dumps(header).encode().ljust(len(head)) + b"\n" + engine)
        with pytest.raises(EngineError, match=r"vocoder\.plan: built from another vocoder\.onnx \(or its external "
                                              r"data\) than the artifact's"):
            backend.load(onnx_path)
        plan.write_bytes(b"a plan from somewhere else")
        with pytest.raises(EngineError, match=r"vocoder\.plan: not a plan written by edged-engines plans"):
            backend.load(onnx_path)
        plan.unlink()
        with pytest.raises(EngineError, match=r"vocoder\.plan: no TensorRT plan"):
            backend.load(onnx_path)
    finally:
        backend.close()


def test_the_stamp_covers_the_graphs_external_weight_data(trt, builtin_artifact, tmp_path):
    """A graph whose weights live in `<graph>.onnx.data` (every real-size talker): a plan built from
    other weights than the artifact's now holds is refused, though the .onnx file itself is the same."""
    from engines.tensorrt import build_plans

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    vocoder = art / "vocoder.onnx"
    onnx.save_model(onnx.load(str(vocoder)), str(vocoder), save_as_external_data=True, location="vocoder.onnx.data")
    build_plans(art)
    backend = trt.TrtBackend()
    try:
        backend.load(vocoder)
        data = bytearray((art / "vocoder.onnx.data").read_bytes())
        data[len(data) // 2] ^= 0x40  # other weights, same size, same .onnx
        (art / "vocoder.onnx.data").write_bytes(bytes(data))
        with pytest.raises(EngineError, match=r"vocoder\.plan: built from another vocoder\.onnx \(or its external data"):
            backend.load(vocoder)
    finally:
        backend.close()


def test_a_refused_shape_or_address_names_the_tensor(trt, artifact):
    """A prefill longer than any profile admits, an address TensorRT refuses: errors naming the tensor."""
    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker, d, t = synth.core.talker, a.dims, a.max_seq + 1  # one row more than the context profile's maximum
        backend.sealed = False  # this test claims buffers of its own after boot
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


def test_state_and_the_predictor_heads_live_in_device_memory(trt, artifact):
    """The KV caches, the new K/V rows, the vocoder state and the code predictor's stacked heads (read
    by every pass: uncached if pinned) are device memory, which the double maps PROT_NONE, so a host
    read or write of them would have crashed the synthesis above; the small per-step I/O is pinned."""
    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker, vocoder = synth.core.talker, synth.core.vocoder
        device = [*talker.keys, *talker.values, *talker.new_keys, *talker.new_values, *talker.prefill_keys,
                  *talker.prefill_values, *talker.cp_keys, *talker.cp_values, talker.cp_heads,
                  *(x for keys, values in talker.cp_new.values() for x in (*keys, *values)),
                  *talker.cp_hidden.values(), *talker.cp_draft_probs.values(), *talker.draft_probs.values(),
                  talker.draft_hidden,
                  *(x for side in vocoder.states for state in side for x in state)]
        from edged.backends.cuda_device import _allocation as allocation

        assert all(isinstance(allocation(x)[0], ctypes.Array) and not hasattr(allocation(x)[0], "get_device_pointer")
                   for x in device)
        host = [talker.hidden, talker.code0, talker.seen, talker.noise, talker.cp_codes[1], talker.positions,
                talker.appending, *vocoder.pcm]
        assert all(hasattr(allocation(x)[0], "get_device_pointer") for x in host)
    finally:
        backend.close()


def test_kv_appends_ride_inside_the_steps_cuda_graphs(trt, artifact):
    """A step of a cohort of 4 puts one graph launch per plan on the stream: the decode (its K/V append
    for every layer and member inside the graph) and the code predictor's passes (theirs inside too);
    no copy. Before, every layer's K and V of every member was a 2-D copy of its own (2 x layers x
    members per step, here 16; 370 at the real sizes). The backend's own count is the stream's."""
    from edged.core import Core

    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        core = Core(a, backend)
        core.preallocate()
        members = [core.prepare(SpeechRequest(f"m{i}", f"Member {i} of the cohort.", sampling=Sampling.greedy()), i)
                   for i in range(a.max_batch)]
        appends = [p._append for plans in core.talker.decode_plans for p in plans.values()]
        assert all(p is not None for p in appends)
        stream, launches = backend.stream, backend.launches
        before, graphs = stream.operations, sys.modules["edged.backends.cuda_graph"].driver().launches
        steps = 5
        for _ in range(steps):
            core.talker.step_cohort(members)
        passes = a.dims.code_groups - 1
        assert stream.operations - before == steps * (1 + passes) == backend.launches - launches
        assert sys.modules["edged.backends.cuda_graph"].driver().launches - graphs == steps * (1 + passes)
    finally:
        backend.close()


def test_a_failed_capture_is_ended_cleaned_up_and_the_plan_enqueued(trt, artifact, backend, caplog):
    """An engine that cannot be captured (trtexec: "may contain operations that are not permitted under
    CUDA graph capture mode"): its capture is ended, nothing it made is kept, the CUDA runtime's error
    is cleared (else TensorRT's next enqueue reports it and fails), and its plans are enqueued; a graph
    that fails to instantiate is destroyed. Either way the synthesis is ONNX Runtime's."""
    request = [SpeechRequest("f", "No graphs today.", sampling=Sampling.greedy(), max_frames=12)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(request)[0]
    libcuda = sys.modules["edged.backends.cuda_graph"].driver()
    fake_trt.CAPTURE_UNSAFE.add("code_predictor.onnx")
    trt_backend = trt.TrtBackend()
    try:
        with caplog.at_level("WARNING", logger="edged.tensorrt"):
            synth = Synthesizer(load_artifact(artifact), trt_backend)
            got = synth.synthesize(request)[0]
        verify = synth.core.talker.verify_plans[0][0, 2]
        assert verify._graph is None and synth.core.talker.decode_plans[0][64]._graph is not None
        assert not libcuda.graphs and fake_cuda.RUNTIME.peek() == 0 and trt_backend.stream.captured is None
        report = trt_backend.graph_report()
        passes = sum(p.graphed for plans in synth.core.talker.verify_plans for p in plans.values())
    finally:
        trt_backend.close()
    assert np.array_equal(want.frames, got.frames)
    assert ("no CUDA graph for code_predictor.onnx (pass of 4 member(s), 1 row(s) from head 2): code_predictor.onnx: "
            "execute_async_v3 failed; it is enqueued per run instead") in caplog.text
    assert report["failed"] and all(f["plan"].startswith("code_predictor.onnx (") for f in report["failed"])
    assert report["captured"] + len(report["failed"]) == report["marked"] == report["captured"] + passes
    fake_trt.CAPTURE_UNSAFE.clear()
    libcuda.fail_instantiate = True
    trt_backend = trt.TrtBackend()
    try:
        got = Synthesizer(load_artifact(artifact), trt_backend).synthesize(request)[0]
        assert trt_backend.graphs() == 0 and not libcuda.graphs and not libcuda.execs
    finally:
        trt_backend.close()
    assert np.array_equal(want.frames, got.frames)


@pytest.mark.parametrize("touch", ["device", "freed pinned"])
def test_the_host_cannot_touch_device_or_freed_memory(touch):
    """The double's device memory is what the device's is to the host, and a freed page-locked buffer
    is unmapped (cuMemFreeHost): touching either kills the process."""
    make = {"device": "a = fake_cuda.mem_alloc(4096)\n"
                      "x = np.frombuffer((ctypes.c_byte * 4096).from_address(int(a)), dtype=np.uint8)\n"
                      "fake_cuda.memset_d8(int(a), 7, 4096)\n",
            "freed pinned": "x = fake_cuda.pagelocked_zeros((4096,), np.uint8, mem_flags=2)\n"
                            "x[0] = 7\n"
                            "x.base.free()\n"}[touch]
    code = ("import sys; sys.path.insert(0, 'tests'); from support import fake_cuda; import numpy as np, ctypes\n"
            + make + "print('made', flush=True)\nprint(int(x[0]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout == "made\n" and done.returncode == -signal.SIGSEGV, (done.stdout, done.stderr)


def test_the_cuda_double_keeps_cudas_promises(trt):
    """Streams are asynchronous (a pending destination reads as garbage until synchronize); a 2-D copy
    takes only pitches a pitched allocation computed; a pinned buffer has a device pointer only with
    DEVICEMAP; memory a pending operation uses cannot be freed; a capture refuses potentially unsafe
    calls (allocations, synchronizing) and calls on the legacy stream (synchronous copies and memsets),
    each as the driver does, and is invalidated by them and by a module load, which succeeds; the
    legacy stream cannot be captured."""
    cuda = fake_cuda
    context = cuda.Context()
    context.push()
    try:
        stream = cuda.Stream()
        src = cuda.pagelocked_zeros((64,), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
        dst = cuda.pagelocked_zeros((64,), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
        src[:] = np.arange(64)
        cuda.memcpy_dtod_async(dst.base.get_device_pointer(), src.base.get_device_pointer(), 256, stream)
        assert np.isnan(dst).all()  # pending: what the host reads is not the result
        with pytest.raises(cuda.LogicError, match="still uses was released before the stream synchronized"):
            src.base.free()
        stream.synchronize()
        assert np.array_equal(dst, np.arange(64))
        with pytest.raises(cuda.LogicError, match="not allocated with CU_MEMHOSTALLOC_DEVICEMAP"):
            cuda.pagelocked_zeros((4,), np.float32).base.get_device_pointer()
        copy = cuda.Memcpy2D()
        device = cuda.mem_alloc(4096)
        copy.set_src_device(int(device))
        copy.set_dst_device(int(device) + 2048)
        copy.width_in_bytes, copy.height, copy.src_pitch, copy.dst_pitch = 16, 4, 64, 64
        with pytest.raises(cuda.LogicError, match="pitch 64 was not computed by cuMemAllocPitch"):
            copy(stream)
        pitched, pitch = cuda.mem_alloc_pitch(100, 8, 4)
        copy.set_src_device(int(pitched))
        copy.set_dst_device(int(pitched) + 4 * pitch)
        copy.src_pitch = copy.dst_pitch = pitch
        copy(stream)
        libcuda, graph = cuda.Driver(), ctypes.c_void_p()
        assert libcuda.cuStreamBeginCapture_v2(ctypes.c_void_p(0), 1) == cuda.CUDA_ERROR_INVALID_VALUE  # legacy
        assert libcuda.cuStreamBeginCapture_v2(ctypes.c_void_p(stream.handle), 1) == 0
        for unsafe, refusal in ((lambda: cuda.mem_alloc(256), "UNSUPPORTED"), (stream.synchronize, "UNSUPPORTED"),
                                (lambda: cuda.memcpy_htod(int(device), src[:4]), "IMPLICIT"),
                                (lambda: cuda.memset_d8(int(device), 0, 16), "IMPLICIT")):
            with pytest.raises(cuda.LogicError, match=f"CUDA_ERROR_STREAM_CAPTURE_{refusal}"):
                unsafe()
        cuda.Stream()  # allowed while capturing, as on the GPU
        assert libcuda.cuStreamEndCapture(ctypes.c_void_p(stream.handle), ctypes.byref(graph)) == \
            cuda.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and graph.value is None
        assert libcuda.cuStreamBeginCapture_v2(ctypes.c_void_p(stream.handle), 1) == 0
        cuda.module_from_buffer(cuda.compile(edged_kernels.SOURCE))  # succeeds, and the capture is lost
        assert libcuda.cuStreamEndCapture(ctypes.c_void_p(stream.handle), ctypes.byref(graph)) == \
            cuda.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and graph.value is None
        stream.synchronize()
        device.free()
        pitched.free()
    finally:
        cuda.Context.pop()
    with pytest.raises(cuda.LogicError, match="no current context"):
        cuda.Context.pop()


def test_the_tensorrt_double_keeps_tensorrts_promises(trt, artifact):
    """execute_async_v3 runs only with every shape and address set, a current context and activation
    memory (USER_MANAGED has none until set_device_memory, which takes aligned device memory of at
    least the engine's size); the legacy stream 0 is a stream; a USER_MANAGED context chooses a
    profile before or after it has device memory (the header orders neither; NVIDIA's runners do
    both), and two live contexts may choose the same one (profile sharing, TensorRT 10); outputs are
    garbage until the stream syncs."""
    engine = engine_of(load_artifact(artifact).file("talker").with_suffix(".plan"))
    user = fake_trt.ExecutionContextAllocationStrategy.USER_MANAGED
    fake_cuda.Context().push()
    try:
        memory = fake_cuda.mem_alloc(engine.device_memory_size_v2)
        first, second = engine.create_execution_context(user), engine.create_execution_context(user)
        with pytest.raises(RuntimeError, match="Error in set optimization profile async"):
            first.set_optimization_profile_async(2, 0)  # the talker has two profiles
        assert first.set_optimization_profile_async(1, 0)  # before its memory (multimodalRunner.cpp's order)
        first.set_device_memory(int(memory), engine.device_memory_size_v2)
        second.set_device_memory(int(memory), engine.device_memory_size_v2)
        assert second.set_optimization_profile_async(1, 0)  # after it (llmEngineRunner.cpp's order)
        fake_cuda.stream_of(0).synchronize()
        assert first.device_profile == second.device_profile == 1
        del first, second
        ctx = engine.create_execution_context(user)  # profile 0: one prefill row over the one-slot cache
        buffers = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = [1 if d < 0 else d for d in engine.get_tensor_shape(name)]
            dtype = fake_trt.nptype(engine.get_tensor_dtype(name))
            buffers[name] = fake_cuda.pagelocked_zeros(shape, dtype, mem_flags=2)
            assert ctx.set_tensor_address(name, buffers[name].base.get_device_pointer())
            if engine.get_tensor_mode(name) is fake_trt.TensorIOMode.INPUT:
                assert ctx.set_input_shape(name, shape)
        assert not ctx.set_tensor_address("positions", buffers["positions"].base.get_device_pointer() + 8)
        assert not ctx.execute_async_v3(0)  # no activation memory yet
        with pytest.raises(RuntimeError, match="256-byte aligned device memory of at least"):
            ctx.set_device_memory(buffers["noise"].base.get_device_pointer(), engine.device_memory_size_v2)
        with pytest.raises(RuntimeError, match="at least"):
            ctx.set_device_memory(int(memory), engine.device_memory_size_v2 - 256)
        ctx.set_device_memory(int(memory), engine.device_memory_size_v2)
        buffers["top_p"][:] = 1.0
        assert ctx.execute_async_v3(0)  # the legacy stream is a stream
        assert np.isnan(buffers["hidden"]).all()  # not run yet
        fake_cuda.stream_of(0).synchronize()
        assert np.isfinite(buffers["hidden"]).all() and ctx.executions == 1
        ctx.shapes.pop("noise")
        assert "noise" in ctx.infer_shapes() and not ctx.execute_async_v3(0)
    finally:
        fake_cuda.Context.pop()
    assert not ctx.execute_async_v3(0)  # no current context


def test_the_builder_refuses_what_tensorrt_10_3_refuses(trt, builtin_artifact, tmp_path):
    """A blocked INT8 DequantizeLinear and INT4 in 32-row blocks: build returns None (logged); an
    operator onnx-tensorrt has no importer for: the parser refuses, naming it; INT4 with fp32 scales
    and TF32 left on: built, with warnings, and the engine says so."""
    from engines.fp16 import convert_file
    from engines.quantize import quantize_file
    from engines.weight_form import WeightForm

    def build(path: Path, flags=()):
        logger = fake_trt.Logger()
        builder = fake_trt_build.Builder(logger)
        network = builder.create_network(1 << int(fake_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = fake_trt_build.OnnxParser(network, logger)
        if not parser.parse_from_file(str(path)):
            return None, [str(parser.get_error(i)) for i in range(parser.num_errors)]
        config = builder.create_builder_config()
        for flag in flags:
            config.clear_flag(flag)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            shape = network.get_input(i).shape
            if -1 in shape:
                profile.set_shape(network.get_input(i).name, *[[1 if d < 0 else d for d in shape]] * 3)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        return (None if plan is None else fake_trt.Runtime(logger).deserialize_cuda_engine(plan)), logger.messages

    talker = builtin_artifact / "talker.onnx"
    for form, message in ((WeightForm("cpu", "int8", 32), "block quantization is supported only for 2-D input tensors "
                                                          "with DataType::kINT4"),
                          (WeightForm("cpu", "int4", 32), "INT4 block size 32 is not supported (64 or 128)")):
        quantize_file(talker, tmp_path / "q.onnx", form)
        engine, messages = build(tmp_path / "q.onnx")
        assert engine is None and any(message in m for _, m in messages), messages
    quantize_file(talker, tmp_path / "q.onnx", WeightForm("cpu", "int4", 64))  # INT4 blocks, fp32 scales
    engine, messages = build(tmp_path / "q.onnx")
    assert engine.fp32_int4_products > 0 and engine.tf32
    assert any("dequantize to FLOAT" in m for _, m in messages) and any("TF32 is enabled" in m for _, m in messages)
    convert_file(talker, tmp_path / "fp16.onnx")  # the Jetson form quantizes the fp16 network's weights
    quantize_file(tmp_path / "fp16.onnx", tmp_path / "q.onnx", WeightForm("jetson", "int4", 64))
    int4 = [i for i in onnx.load(str(tmp_path / "q.onnx"), load_external_data=False).graph.initializer
            if i.data_type == onnx.TensorProto.INT4]
    engine, messages = build(tmp_path / "q.onnx", flags=[fake_trt.BuilderFlag.TF32])
    assert int4 and engine.fp32_int4_products == 0 and not engine.tf32 and not messages
    model = onnx.load(str(talker))
    model.graph.node[0].op_type = "Unique"
    onnx.save(model, str(tmp_path / "unknown.onnx"))
    engine, errors = build(tmp_path / "unknown.onnx")
    assert engine is None and errors and all("No importer registered for op: Unique" in e for e in errors)


def test_tf32_is_cleared_and_aux_streams_are_off_for_every_plan(trt, builtin_artifact, tmp_path):
    """TF32 is on by default in every builder config and STRONGLY_TYPED does not clear it: `plans`
    clears it, so fp32 (and a strongly typed plan's fp32 islands) stays fp32. Auxiliary streams are
    TensorRT's choice by default: `plans` sets none (one stream, activations reused)."""
    from engines.fp16 import convert_artifact
    from engines.tensorrt import build_plans

    fp32, fp16 = tmp_path / "fp32", tmp_path / "fp16"
    shutil.copytree(builtin_artifact, fp32)
    convert_artifact(builtin_artifact, fp16)
    fake_trt.LOGGERS.clear()
    engines = [engine_of(p) for art in (fp32, fp16) for p in build_plans(art)]
    assert len(engines) == 8 and not any(e.tf32 for e in engines) and sum(e.strongly_typed for e in engines) == 4
    assert all(e.aux_streams == 0 and e.profiling_verbosity is fake_trt.ProfilingVerbosity.DETAILED for e in engines)
    assert not any("TF32" in m for logger in fake_trt.LOGGERS for _, m in logger.messages)


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
    """An int4 twin in the Jetson form (the form users deploy) is built as strongly typed networks whose
    INT4 products are all fp16 GEMMs, and synthesizes what ONNX Runtime does on the same artifact, frame
    for frame; fp32 is not strongly typed; a cpu-form twin is refused before anything is built, saying
    why."""
    from edged.backends import make_backend
    from engines.quantize import quantize_artifact
    from engines.tensorrt import build_plans

    int4 = tmp_path / "int4"
    quantize_artifact(builtin_artifact, int4, "int4", "jetson", block=64)
    engines = {p.stem: engine_of(p) for p in build_plans(int4)}
    assert sorted(engines) == ["code_predictor", "code_predictor_draft", "talker", "vocoder"]
    assert all(e.strongly_typed and e.fp32_int4_products == 0 for e in engines.values())
    fp32 = tmp_path / "fp32"
    shutil.copytree(builtin_artifact, fp32)
    assert not any(engine_of(p).strongly_typed for p in build_plans(fp32))
    cpu = tmp_path / "cpu"
    quantize_artifact(builtin_artifact, cpu, "int4")
    with pytest.raises(SystemExit, match="TensorRT 10.3 cannot build this artifact: its int4 weights are in the cpu form"):
        build_plans(cpu)
    assert not list(cpu.glob("*.plan"))
    requests = [SpeechRequest("q", "Four-bit weights.", sampling=Sampling.greedy(), max_frames=12),
                SpeechRequest("r", "And a second one, sampled.", voice="eric", sampling=Sampling(seed=3), max_frames=9)]
    want = Synthesizer(load_artifact(int4), make_backend("onnxruntime", threads=1)).synthesize(requests)
    backend = trt.TrtBackend()
    try:
        got = Synthesizer(load_artifact(int4), backend).synthesize(requests)
    finally:
        backend.close()
    for w, g in zip(want, got):
        assert len(g.frames) == w.report["frames"] > 0 and np.array_equal(w.frames, g.frames), w.id
        # an fp16 vocoder, whose sums the double's ONNX Runtime threads round otherwise: 67 dB measured
        assert 10 * np.log10(np.sum(w.pcm ** 2) / max(np.sum((w.pcm - g.pcm) ** 2), 1e-30)) > 50, w.id


def test_plans_refuse_an_int8_artifact_with_the_reason_and_a_failed_build_is_an_error(trt, builtin_artifact, tmp_path,
                                                                                      monkeypatch):
    """`edged-engines plans` on an int8 artifact: refused, saying why (its blocked INT8 DequantizeLinear
    would not build); and were it let through, the builder's None is the command's error, not a plan."""
    from engines import tensorrt as engines_trt
    from engines.cli import main as engines_main
    from engines.quantize import quantize_artifact

    int8 = tmp_path / "int8"
    quantize_artifact(builtin_artifact, int8, "int8")
    with pytest.raises(SystemExit, match="TensorRT 10.3 cannot build this artifact: int8 has no Jetson form"):
        engines_main(["plans", str(int8)])
    monkeypatch.setattr(engines_trt, "weights_refusal", lambda model: None)
    with pytest.raises(SystemExit, match=r"talker\.onnx: TensorRT build failed"):
        engines_main(["plans", str(int8)])
    assert not list(int8.glob("*.plan"))


def test_validate_jetson_offers_no_int8_twin(tmp_path):
    """Defect 1: blocked DequantizeLinear "is supported only for 2-D input tensors with DataType::kINT4"
    (NvInfer.h v10.3.0, IDequantizeLayer), so the acceptance run offers int4 (the Jetson form) only."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_jetson.py"), "--backend", "onnxruntime",
                           "--artifact", str(tmp_path / "none"), "--weights", "int8"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'int8'" in done.stderr, done.stderr


def test_one_activation_block_serves_every_context(trt, artifact):
    """Every execution context (one per profile for the enqueued plans, one per captured graph) is
    USER_MANAGED on one block of device memory, the largest engine's size, instead of a kSTATIC block
    of its own each."""
    backend = trt.TrtBackend()
    try:
        Synthesizer(load_artifact(artifact), backend)
        contexts = [c.context for e in backend.engines for c in e.contexts()]
        assert len(contexts) > backend.graphs() > 0 and all(c.own_memory is None for c in contexts)
        assert {c.memory for c in contexts} == {int(backend.activations)}
        assert backend.activation_bytes() == max(e.engine.device_memory_size_v2 for e in backend.engines) > 0
        static = sum(e.engine.device_memory_size_v2 * len(e.profiles) for e in backend.engines)
        assert static > 2 * backend.activation_bytes()
    finally:
        backend.close()


def test_plans_are_streamed_at_write_and_mapped_at_load(trt, builtin_artifact, tmp_path, monkeypatch):
    """A 48 MiB plan is written from TensorRT's buffer and read from a memory map: neither copies it
    in host memory (on an Orin, host memory is the GPU's DRAM too)."""
    from edged.backends.plan_file import write_plan
    from engines.tensorrt import build, profiles, sizes

    art = tmp_path / "art"
    shutil.copytree(builtin_artifact, art)
    monkeypatch.setattr(fake_trt_build, "PLAN_PADDING", 48 << 20)
    a = load_artifact(art)
    by_role = sizes({"max_batch": a.max_batch, "max_seq": a.max_seq}, a.dims.code_groups)
    onnx_path = a.file("code_predictor")
    assert len(profiles("code_predictor")) == 1
    plan = build(onnx_path, "code_predictor", by_role, strongly_typed=False)
    tracemalloc.start()
    try:
        write_plan(onnx_path.with_suffix(".plan"), plan, trt.trt.__version__, onnx_path)
        written = tracemalloc.get_traced_memory()[1]
        del plan
        backend = trt.TrtBackend()
        (art / "kernels.cubin").write_bytes(b"")  # not needed to load an engine here
        backend.kernels = object()
        tracemalloc.reset_peak()
        backend.load(onnx_path)
        loaded = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    backend.close()
    assert onnx_path.with_suffix(".plan").stat().st_size > 48 << 20
    assert written < 4 << 20 and loaded < 4 << 20, (written, loaded)


def test_boot_captures_the_graphs_the_configuration_runs(trt, artifact):
    """CUDA graphs at boot: every decode span and batch size, every vocoder plan, and the code predictor's
    passes of the default verify window (here off: one pass per group); the passes and drafts of other
    windows are bound and enqueued when a request asks for them. Each graph is uploaded when it is
    instantiated and replayed once at boot, before any request."""
    a = load_artifact(artifact)
    b, g, spans = a.max_batch, a.dims.code_groups, len(__import__("edged.talker.stage").talker.stage.buckets(a.max_seq))
    libcuda = sys.modules["edged.backends.cuda_graph"].driver()
    for window, extra in ((0, 0), (2, 2)):  # verify window 2: a pass of 2 rows, a draft of 1, per batch size
        backend = trt.TrtBackend()
        try:
            launched = libcuda.launches
            synth = Synthesizer(a, backend, graph_window=window)
            vocoder = len(synth.core.vocoder.plans)
            assert backend.graphs() == b * spans + b * (g - 1 + extra) + vocoder, window
            assert libcuda.launches - launched == backend.graphs() and libcuda.launched_before_upload == 0
            assert backend.graph_report() == {"enabled": True, "marked": backend.graphs(), "captured": backend.graphs(),
                                              "failed": []}
            assert vocoder == b * 2 * 4  # slot x side x window length
            verify = synth.core.talker.verify_plans[0]
            assert (verify[1, 2]._graph is not None) == (window >= 2)
            synth.synthesize([SpeechRequest("v", "Verified in pairs.", sampling=Sampling(seed=1, cp_spec_verify_size=2),
                                            max_frames=8)])
        finally:
            backend.close()


def test_voices_primed_back_to_back_keep_their_own_state(trt, artifact):
    """Two in-context voices prepared one after the other: each slot's vocoder state is its own voice's,
    though both were staged through the same host buffer (the stage is reused only after sync())."""
    from edged.core import Core

    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        core = Core(a, backend)
        core.preallocate()
        vocoder = core.vocoder
        rng = np.random.default_rng(5)
        primed = [tuple(rng.standard_normal((1, *s.shape)).astype(np.float32) for s in vocoder.state_specs)
                  for _ in range(2)]
        prime = np.zeros((3, a.dims.code_groups), np.int64)
        vocoder.prepare(0, prime, primed[0])
        vocoder.prepare(1, prime, primed[1])
        backend.sealed = False  # the test's own buffers to read the state back, after boot
        for slot in (0, 1):
            for state, want in zip(vocoder.states[0], primed[slot]):
                got = backend.empty(want.shape, np.float32)
                backend.copy(got, state[slot])
                backend.sync()
                assert np.array_equal(got, want), slot
    finally:
        backend.close()


def test_the_kernels_compile_for_an_orin():
    """The CUDA source the backend launches builds for sm_87 with nvcc (where there is one); the double
    runs the same source compiled for this CPU."""
    from edged.backends import kernels

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    done = subprocess.run([nvcc, "-arch=sm_87", "-cubin", "-x", "cu", "-o", "/dev/null", "-"], input=kernels.SOURCE,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_validate_jetson_rows_through_the_doubles(trt, artifact):
    """The device acceptance run's rows for CUDA graphs (every step plan captured, the same frames both
    ways, replay faster or FAIL), activation memory, memory by stage, launches per step (exactly one
    graph launch per plan) and boot time, run through the doubles."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import validate_jetson
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    summary = validate_jetson.Summary()
    validate_jetson.cuda_graphs(artifact, "tensorrt", summary)
    validate_jetson.activation_memory(artifact, "tensorrt", summary)
    validate_jetson.memory_by_stage(artifact, "tensorrt", summary)
    validate_jetson.launches_per_step(artifact, "tensorrt", summary)
    validate_jetson.boot_time("serving qwen3_tts on ipc:///x (artifact a, max_batch 4, 60 CUDA graphs, boot 12.5 s)",
                              summary)
    validate_jetson.boot_time("serving qwen3_tts on ipc:///x (artifact a, max_batch 4, 672 CUDA graphs, boot 95.0 s)",
                              summary)
    rows = {check: (verdict, detail) for check, verdict, detail in summary.rows[:5]}
    graphs = re.fullmatch(r"60 of 60 step plans captured; frames equal: True; after other plans re-bound the contexts: "
                          r"True; per frame with graphs: .* \(([\d.]+)x: replay must be faster\)", rows["CUDA graphs"][1])
    assert graphs, rows["CUDA graphs"]
    speedup = float(graphs.group(1))  # printed to 0.01: at 1.00 the row may go either way
    assert rows["CUDA graphs"][0] in ({"PASS"} if speedup > 1 else {"FAIL"} if speedup < 1 else {"PASS", "FAIL"})
    contexts = re.search(r"for (\d+) contexts \(kSTATIC", rows["activation memory"][1])
    # one per captured graph (60), and the shared ones of the plans enqueued (the talker's prefills, ...)
    assert rows["activation memory"][0] == "PASS" and contexts and int(contexts.group(1)) > 60
    assert rows["memory by stage"][0] == "PASS" and re.match(
        r"CUDA context -?\d+ MiB; engines -?\d+ MiB; boot -?\d+ MiB; warm-up -?\d+ MiB \(buffers and activations claimed: "
        r"\d+ MiB\); 63 execution contexts at -?[\d.]+ MiB each", rows["memory by stage"][1])
    a = load_artifact(artifact)
    g = a.dims.code_groups
    assert rows["launches per step"] == ("PASS", f"{g:.1f} at batch 4 (must be {g}: one graph launch per plan; 60 of 60 "
                                                 f"step plans captured; {2 * a.dims.layers * 4} K/V copies before)")
    assert rows["boot time"] == ("PASS", "12.5 s (60 CUDA graphs captured); TimeoutStartSec 180 s")
    assert summary.rows[5][:2] == ("boot time", "FAIL")
    fake_trt.CAPTURE_UNSAFE.add("vocoder.onnx")  # graphs the boot could not capture fail both rows
    summary = validate_jetson.Summary()
    validate_jetson.cuda_graphs(artifact, "tensorrt", summary)
    validate_jetson.launches_per_step(artifact, "tensorrt", summary)
    assert [verdict for _, verdict, _ in summary.rows] == ["FAIL", "FAIL"]
    assert "NOT CAPTURED vocoder.onnx (window of 1 frame(s), slot 0, side 0): " in summary.rows[0][2]


def test_after_boot_nothing_is_claimed_whatever_the_requests(trt, artifact, monkeypatch):
    """Every device buffer is claimed at boot: the prefill of every prompt length the layout admits
    (bound at admission, 64 kept) finds its profile's context and its K/V append table reserved, so
    requests of any length, and every length bound once more after its plan was dropped, allocate
    nothing through the CUDA double. Without the reservation the first admission is refused, named."""
    from edged.talker import stage

    a = load_artifact(artifact)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        talker = synth.core.talker
        claims, contexts = fake_cuda.CLAIMS[0], len(fake_trt.LIVE)
        synth.synthesize([SpeechRequest(r.id, r.text, voice=r.voice, language=r.language, dual_track=r.dual_track,
                                        sampling=Sampling.greedy(), max_frames=6) for r in REQUESTS])
        for t in [*range(1, a.max_seq), *range(1, stage.PREFILL_PLANS + 2)]:  # the longest too, and dropped ones again
            talker._prefill_plan(t)
        assert (fake_cuda.CLAIMS[0], len(fake_trt.LIVE)) == (claims, contexts)
    finally:
        backend.close()
    monkeypatch.setattr(trt.TrtEngine, "reserve", lambda self, later: None)
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(a, backend)
        with pytest.raises(EngineError, match=r"after boot: every buffer is claimed at boot"):
            synth.synthesize([SpeechRequest("late", "Not reserved.", max_frames=2)])
    finally:
        backend.close()


JETPACK_6_0 = "TensorRT 8.6.2 found; edged needs TensorRT >= 10.3 (JetPack 6.1 or later)"


def test_the_version_rule_admits_tensorrt_10_3_and_later():
    from edged.backends.tensorrt_version import refusal

    for good in ("10.3.0.30", "10.3", "10.10.1", "11.0.0", fake_trt.__version__):
        assert refusal(good) is None, good
    for old in ("8.6.2", "10.2.0.19", "9.9", "x.y"):
        assert refusal(old) == f"TensorRT {old} found; edged needs TensorRT >= 10.3 (JetPack 6.1 or later)", old


def test_tensorrt_8_6_is_refused_by_name_by_the_backend_and_by_plans(monkeypatch, tmp_path):
    """JetPack 6.0's TensorRT: the backend refuses it at import (else an AttributeError at boot), and
    `edged-engines plans` before it builds, each naming the version found and the one needed."""
    doubles = fake_trt.install(monkeypatch)
    monkeypatch.setattr(doubles.trt, "__version__", "8.6.2")
    from edged.backends import make_backend
    from engines.tensorrt import build_plans

    with pytest.raises(EngineError) as refused:
        make_backend("tensorrt")
    assert str(refused.value) == JETPACK_6_0
    assert fake_trt.stack_depth() == 0  # refused before a CUDA context was pushed
    with pytest.raises(SystemExit) as plans:
        build_plans(tmp_path)
    assert str(plans.value) == f"edged-engines plans: {JETPACK_6_0}"


def test_the_install_check_names_what_is_missing_or_too_old(monkeypatch, capsys):
    """`python -m edged.backends.tensorrt_version`, which the install scripts run: one line, exit 1,
    for TensorRT missing or too old and for pycuda missing; exit 0 on TensorRT 10.3 with pycuda."""
    from edged.backends import tensorrt_version

    doubles = fake_trt.install(monkeypatch)
    assert tensorrt_version.main() == 0
    assert capsys.readouterr().out == f"TensorRT {fake_trt.__version__} and pycuda: the tensorrt backend can load\n"
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    assert tensorrt_version.main() == 1
    assert capsys.readouterr().err.startswith(f"TensorRT {fake_trt.__version__} found, pycuda not (")
    monkeypatch.setattr(doubles.trt, "__version__", "8.6.2")
    assert tensorrt_version.main() == 1
    assert capsys.readouterr().err == JETPACK_6_0 + "\n"
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert tensorrt_version.main() == 1
    err = capsys.readouterr().err
    assert err.startswith("no TensorRT Python bindings (") and "python3-libnvinfer" in err and err.count("\n") == 1


def test_a_daemon_on_tensorrt_8_6_fails_its_boot_with_one_line(tmp_path):
    """`backend = "tensorrt"` on JetPack 6.0: `boot failed: TensorRT 8.6.2 found; ...`, no traceback, exit 2
    (the config or artifact cannot be used), so systemd's restarts end with the reason in the journal."""
    config = tmp_path / "edged.toml"
    config.write_text('[daemon]\nbackend = "tensorrt"\n[audio]\ndevice = "none"\ninput_device = "none"\n'
                      '[events]\nlisten = "none"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), XDG_STATE_HOME=str(tmp_path / "state"))
    done = subprocess.run([sys.executable, str(ROOT / "tests/support/with_fake_trt.py"), "8.6.2", "serve", "--config",
                           str(config), "--listen", f"ipc://{tmp_path}/edged.sock"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    complaints = [line for line in done.stderr.splitlines() if "ERROR" in line or "Traceback" in line]
    assert len(complaints) == 1 and complaints[0].endswith(f"edged: boot failed: {JETPACK_6_0}"), done.stderr


def test_each_captured_graph_has_its_own_context_and_replays_right_after_other_plans_rebind(trt, artifact, backend):
    """A captured plan runs on an execution context of its own, bound once: the plans that are enqueued
    (prefills, and the code predictor's passes of a verify window the boot did not capture) share one
    context per profile and re-bind it between replays, which would change the internal state a graph
    captured on it replays with (the double's replay reads the context as it is then, as the device
    does). Frames equal ONNX Runtime's, and no captured graph's context changed after the boot."""
    requests = [SpeechRequest(r.id, r.text, r.voice, r.language, sampling=Sampling(seed=i, cp_spec_verify_size=2),
                              max_frames=r.max_frames) for i, r in enumerate(REQUESTS[:3])]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(requests)
    trt_backend = trt.TrtBackend()
    try:
        synth = Synthesizer(load_artifact(artifact), trt_backend)
        engines = trt_backend.engines
        own = [c for e in engines for c in e.contexts() if c not in e.shared.values()]
        state = [c.context._state() for c in own]
        got = synth.synthesize(requests)  # garbage codes (an IndexError or other frames) on shared contexts
        for w, g in zip(want, got):
            assert np.array_equal(w.frames, g.frames), w.id
        assert len(own) == trt_backend.graphs() > 0 and len({id(c.context) for c in own}) == len(own)
        assert all(p._context not in e.shared.values() for e in engines for p in e.captured)
        assert [c.context._state() for c in own] == state
        verify = synth.core.talker.verify_plans[0][1, 2]  # a pass of 2 rows: on the shared context, and run
        assert verify._graph is None and verify._context in verify._engine.shared.values()
        assert verify._context.context.executions > 0
    finally:
        trt_backend.close()


def test_a_replayed_graph_reads_its_context_as_it_is_at_the_replay(trt, artifact):
    """The double: a graph captured on a context whose shapes or addresses are set anew before the
    replay writes garbage (0xFF bytes, NaN) where its outputs go, as the device would silently."""
    from edged.backends.cuda_graph import Graph

    engine, ctx, buffers, stream = _bound_context(artifact, "code_predictor")
    try:
        ctx.execute_async_v3(stream.handle)
        stream.synchronize()
        want = buffers["hidden"].copy()
        graph = Graph(stream.handle, lambda: ctx.execute_async_v3(stream.handle))
        graph.launch()
        stream.synchronize()
        assert np.array_equal(buffers["hidden"], want)
        other = fake_cuda.pagelocked_zeros(buffers["hidden"].shape, np.float32, mem_flags=2)
        ctx.set_tensor_address("hidden", other.base.get_device_pointer())  # another plan binds the context
        ctx.set_tensor_address("hidden", buffers["hidden"].base.get_device_pointer())
        graph.launch()
        stream.synchronize()
        assert np.array_equal(buffers["hidden"], want)  # the same state again: the same work
        ctx.set_tensor_address("hidden", other.base.get_device_pointer())
        graph.launch()
        stream.synchronize()
        assert np.isnan(buffers["hidden"]).all()
        graph.close()
    finally:
        fake_cuda.Context.pop()


def _bound_context(artifact: Path, graph: str, profile: int = 0, switch=None):
    """A USER_MANAGED context of `graph`'s plan with every tensor bound to mapped pinned buffers (at
    the profile's smallest shapes), its memory set and `profile` chosen on `switch` (else on the
    stream it returns), under a pushed CUDA context (the caller pops it)."""
    engine = engine_of(artifact / f"{graph}.plan")
    fake_cuda.Context().push()
    stream = fake_cuda.Stream()
    ctx = engine.create_execution_context(fake_trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    memory = fake_cuda.mem_alloc(engine.device_memory_size_v2)
    ctx.set_device_memory(int(memory), engine.device_memory_size_v2)
    ctx.memory_allocation = memory  # kept alive with the context
    assert ctx.set_optimization_profile_async(profile, (switch or stream).handle)
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        lo = engine.get_tensor_profile_shape(name, profile)[0] if engine.get_tensor_mode(name) is \
            fake_trt.TensorIOMode.INPUT else engine.get_tensor_shape(name)
        shape = [1 if d < 0 else d for d in lo]
        buffers[name] = fake_cuda.pagelocked_zeros(shape, fake_trt.nptype(engine.get_tensor_dtype(name)), mem_flags=2)
        buffers[name][...] = 1 if buffers[name].dtype.kind == "f" else 0
        assert ctx.set_tensor_address(name, buffers[name].base.get_device_pointer())
        if engine.get_tensor_mode(name) is fake_trt.TensorIOMode.INPUT:
            assert ctx.set_input_shape(name, shape)
    return engine, ctx, buffers, stream


def test_a_capture_follows_its_warm_up_after_a_synchronize(trt, artifact, caplog):
    """trtexec (sampleInference.cpp, v10.3) and Edge-LLM synchronize between the warm-up enqueue and the
    capture. The double refuses to capture a context whose warm-up has not completed; the backend
    synchronizes, so every plan the boot tries gets its graph, with no warning."""
    libcuda = sys.modules["edged.backends.cuda_graph"].driver()
    engine, ctx, buffers, stream = _bound_context(artifact, "code_predictor")
    try:
        handle, graph = ctypes.c_void_p(stream.handle), ctypes.c_void_p()
        assert ctx.execute_async_v3(stream.handle)  # the warm-up, still on the stream
        for synchronized in (False, True):
            if synchronized:
                stream.synchronize()
            assert libcuda.cuStreamBeginCapture_v2(handle, 1) == 0
            assert ctx.execute_async_v3(stream.handle) == synchronized
            assert libcuda.cuStreamEndCapture(handle, ctypes.byref(graph)) == 0
            assert libcuda.cuGraphDestroy(graph) == 0
    finally:
        del ctx
        fake_cuda.Context.pop()
    backend = trt.TrtBackend()
    try:
        with caplog.at_level("WARNING"):
            Synthesizer(load_artifact(artifact), backend)
        assert backend.graphs() == sum(len(e.captured) for e in backend.engines) > 0
        assert "no CUDA graph" not in caplog.text
    finally:
        backend.close()


@pytest.mark.parametrize("cudart", ["not TensorRT's", "missing"])
def test_a_failed_capture_falls_back_whatever_libcudart_the_process_has(trt, artifact, backend, caplog, monkeypatch,
                                                                        cudart):
    """TensorRT links its CUDA runtime statically, so clearing the process's libcudart error after a
    failed capture (trtexec's endCaptureOnError) leaves TensorRT's set, and its next call reports it
    (and so clears it); a process may have no libcudart.so.12 to load at all. Either way the boot
    goes on: the plan is enqueued once more on its profile's shared context, retried once, then per
    run, and the synthesis is ONNX Runtime's."""
    from edged.backends import cuda_graph

    if cudart == "missing":
        def missing():
            raise OSError("libcudart.so.12: cannot open shared object file: No such file or directory")
        monkeypatch.setattr(cuda_graph, "runtime", missing)
    request = [SpeechRequest("f", "No vocoder graphs.", sampling=Sampling.greedy(), max_frames=10)]
    want = Synthesizer(load_artifact(artifact), backend).synthesize(request)[0]
    fake_trt.CAPTURE_UNSAFE.add("vocoder.onnx")
    trt_backend = trt.TrtBackend()
    try:
        with caplog.at_level("INFO"):
            synth = Synthesizer(load_artifact(artifact), trt_backend)
            got = synth.synthesize(request)[0]
        vocoder = trt_backend.engines[-1]
        assert vocoder.name == "vocoder.onnx" and vocoder.graphs() == 0 < len(vocoder.captured)
        assert all(p._context is vocoder.shared[0] for p in vocoder.captured) and trt_backend.graphs() > 0
        assert fake_trt.RUNTIME.peek() == 0
    finally:
        trt_backend.close()
    assert np.array_equal(want.frames, got.frames) and np.abs(want.pcm - got.pcm).max() <= 1e-5
    assert "the enqueue after a failed capture reported its error" in caplog.text
    if cudart == "missing":
        assert "libcudart not loaded to clear a failed capture's error (libcudart.so.12: cannot open" in caplog.text


def test_a_profile_switch_takes_effect_in_stream_order(trt, artifact):
    """setOptimizationProfileAsync is stream-ordered: the profile is the device's once the stream it
    was given reaches the switch, and an enqueue on another stream before then is the application's
    error (NvInferRuntime.h: synchronizing "the profile sync stream and the enqueue stream" is its
    responsibility; refused by the double). The backend switches and enqueues on its one stream."""
    other = None
    try:
        fake_cuda.Context().push()
        other = fake_cuda.Stream()
        fake_cuda.Context.pop()
        engine, ctx, buffers, stream = _bound_context(artifact, "talker", profile=1, switch=other)
        with pytest.raises(fake_cuda.LogicError, match="not synchronized with this context's profile switch"):
            ctx.execute_async_v3(stream.handle)  # the switch, still on `other`, and this would race
        other.synchronize()
        assert ctx.execute_async_v3(stream.handle)
        stream.synchronize()
        assert np.isfinite(buffers["hidden"]).all()
        del ctx
    finally:
        fake_cuda.Context.pop()
    backend = trt.TrtBackend()
    try:
        Synthesizer(load_artifact(artifact), backend)
        contexts = [c for e in backend.engines for c in e.contexts()]
        assert {c.context.memory for c in contexts} == {int(backend.activations)}
        assert all(c.context.device_profile == c.index for c in contexts)  # before any sync of another stream
    finally:
        backend.close()


def test_close_releases_every_context_and_engine_before_the_context_is_popped(trt, artifact, monkeypatch):
    """TensorRT's objects free CUDA memory when they are destroyed, which needs the CUDA context:
    `close()` drops every graph, context and engine before it pops it, though the plans (and the
    synthesizer holding them) live on."""
    import gc

    alive_at_pop = []
    pop = fake_cuda.Context.pop

    def counting_pop() -> None:
        gc.collect()
        alive_at_pop.append(sorted(type(x).__name__ for x in fake_trt.LIVE))
        pop()

    fake_trt.LIVE.clear()
    backend = trt.TrtBackend()
    try:
        synth = Synthesizer(load_artifact(artifact), backend)
        synth.synthesize([SpeechRequest("p", "Popped last.", sampling=Sampling.greedy(), max_frames=6)])
        assert len(fake_trt.LIVE) > len(backend.engines)
    finally:
        monkeypatch.setattr(fake_cuda.Context, "pop", staticmethod(counting_pop))
        backend.close()
    assert alive_at_pop == [[]] and synth.core.talker.decode_plans[0]


def test_fresh_device_memory_is_garbage_until_written(trt):
    """cuMemAlloc does not clear what it returns (the double fills it with 0xFF bytes: NaN, -1);
    `device_empty` zeroes its buffers, so a cache read before it is written reads zeros."""
    backend = trt.TrtBackend()
    try:
        raw = fake_cuda.mem_alloc(256)
        seen = backend.empty((64,), np.float32)
        fake_cuda.memcpy_dtod_async(int(seen.base.get_device_pointer()), int(raw), 256, backend.stream)
        backend.sync()
        assert np.isnan(seen).all()
        fresh = backend.device_empty((3, 5), np.int64)
        seen = backend.empty((3, 5), np.int64)
        backend.copy(seen, fresh)
        backend.sync()
        assert not seen.any()
        raw.free()
    finally:
        backend.close()


def test_the_cuda_doubles_kernels_run_their_blocks_in_any_order(trt):
    """CUDA runs a grid's blocks in no set order ("It must be possible to execute them in any order",
    Programming Guide, Thread Hierarchy); the double shuffles them on every launch, so a kernel that
    counted on block order would fail here."""
    source = ('extern "C" __global__ void record_order(long long* log) {\n'
              '    long long i = log[0]++;\n    log[1 + i] = blockIdx.x + gridDim.x * blockIdx.y;\n}\n')
    context = fake_cuda.Context()
    context.push()
    try:
        kernel = fake_cuda.module_from_buffer(fake_cuda.compile(source)).get_function("record_order").prepare("P")
        stream = fake_cuda.Stream()
        log = fake_cuda.mem_alloc(8 * 33)
        seen = fake_cuda.pagelocked_zeros((33,), np.int64, mem_flags=2)
        orders = []
        for _ in range(2):
            fake_cuda.memset_d8(int(log), 0, 8 * 33)
            kernel.prepared_async_call((8, 4), (1, 1, 1), stream, int(log))
            fake_cuda.memcpy_dtod_async(seen.base.get_device_pointer(), int(log), 8 * 33, stream)
            stream.synchronize()
            orders.append(seen[1:].tolist())
        assert all(sorted(o) == list(range(32)) for o in orders) and seen[0] == 32
        assert orders[0] != list(range(32)) and orders[0] != orders[1]
        log.free()
    finally:
        fake_cuda.Context.pop()
