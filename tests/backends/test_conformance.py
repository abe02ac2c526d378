"""Backend conformance: what every Engine backend must do, run against the built-in artifact.

Each test runs on the backend under test (ONNX Runtime here; on a device, scripts/validate_jetson.sh
runs this file with EDGED_TEST_BACKEND=tensorrt against plans built from the same ONNX graphs) and on
the TensorRT backend over the doubles of TensorRT 10.3, pycuda and the CUDA driver
(tests/support/fake_trt.py), whose streams are asynchronous: a result is read after `run()` or
`sync()`.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from support import fake_trt

from edged.artifact import load_artifact
from edged.backends import Append, EngineError, Rows, make_backend
from edged.clone.roles import ROLES as CLONE_ROLES


@pytest.fixture(scope="module", params=["under test", "tensorrt double"])
def target(request, builtin_artifact, tmp_path_factory):
    """(backend, artifact directory): the backend under test, or the TensorRT backend on the doubles
    with plans built for a copy of the artifact."""
    if request.param == "under test":
        backend = make_backend(os.environ.get("EDGED_TEST_BACKEND", "onnxruntime"), threads=1)
        yield backend, builtin_artifact
        backend.close()
        return
    if os.environ.get("EDGED_TEST_BACKEND"):
        pytest.skip("on a device the backend under test is the real TensorRT")
    with pytest.MonkeyPatch.context() as patch:
        fake_trt.install(patch)
        from edged.backends.tensorrt import TrtBackend
        from engines.tensorrt import build_plans

        art = tmp_path_factory.mktemp("conformance") / "art"
        shutil.copytree(builtin_artifact, art)
        build_plans(art)
        backend = TrtBackend()
        backend.load(load_artifact(art).file("code_predictor"))  # the kernels come with the first engine
        yield backend, art
        backend.close()


@pytest.fixture(scope="module")
def backend(target):
    return target[0]


@pytest.fixture(scope="module")
def artifact(target):
    return load_artifact(target[1])


@pytest.fixture(scope="module")
def predictor(artifact, backend):
    return backend.load(artifact.file("code_predictor"))


def _predictor_buffers(artifact, backend, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A frame's first code-predictor pass for n members: two rows each at position 0, head 0, no
    drafts, over a cache of one slot per code group."""
    d = artifact.dims
    rng = np.random.default_rng(seed)
    e = backend.empty
    engine = backend.load(artifact.file("code_predictor"))
    kv_heads, head_dim = engine.inputs["past_keys_0"].shape[1:3]
    g, vc = d.code_groups, d.codebook_size
    heads = artifact.tables()["cp_heads"][:1]
    bufs = {
        "inputs_embeds": e((n, 2, d.hidden), np.float32), "positions": e((n,), np.int64),
        "heads": e(heads.shape, np.float32), "drafts": e((n, 1), np.int64), "draft_probs": e((n, 1, vc), np.float32),
        "temperature": e((n,), np.float32), "top_k": e((n,), np.int64), "top_p": e((n,), np.float32),
        "accept_noise": e((n, 1), np.float32), "noise": e((n, 1, vc), np.float32), "codes": e((n, 1), np.int64),
        "accepted": e((n,), np.int64), "hidden": e((n, 1, heads.shape[1]), np.float32),
    }
    bufs["heads"][:] = heads
    for i in range(sum(name.startswith("past_keys_") for name in engine.inputs)):
        bufs[f"past_keys_{i}"] = e((n, kv_heads, head_dim, g), np.float32)
        bufs[f"past_values_{i}"] = e((n, kv_heads, g, head_dim), np.float32)
        bufs[f"new_keys_{i}"] = e((n, kv_heads, head_dim, 2), np.float32)
        bufs[f"new_values_{i}"] = e((n, kv_heads, 2, head_dim), np.float32)
    bufs["inputs_embeds"][:] = rng.standard_normal((n, 2, d.hidden))
    bufs["temperature"][:] = 0.9
    bufs["top_k"][:] = 50
    bufs["top_p"][:] = 1.0
    bufs["noise"][:] = rng.random(bufs["noise"].shape)
    return bufs


def test_tensor_names_follow_the_manifest(artifact, backend):
    for role, graph in artifact.graphs.items():
        if backend.name == "tensorrt" and role in CLONE_ROLES:
            continue  # ONNX Runtime runs the clone encoder whatever the backend: it has no plan
        engine = backend.load(artifact.file(role))
        assert tuple(engine.inputs) == graph.inputs, role
        assert tuple(engine.outputs) == graph.outputs, role


def test_outputs_land_in_the_bound_buffers_and_are_deterministic(artifact, backend, predictor):
    bufs = _predictor_buffers(artifact, backend, 2)
    codes, hidden = bufs["codes"], bufs["hidden"]
    plan = predictor.plan(bufs)
    plan.run()
    first = codes.copy(), hidden.copy()
    assert bufs["codes"] is codes and codes.max() > 0 and np.abs(hidden).sum() > 0
    plan.run()
    assert np.array_equal(codes, first[0]) and np.array_equal(hidden, first[1])


def test_batch_rows_are_independent(artifact, backend, predictor):
    both = _predictor_buffers(artifact, backend, 2, seed=1)
    predictor.plan(both).run()
    for row in range(2):
        one = {k: backend.empty((1, *v.shape[1:]), v.dtype) for k, v in both.items()}
        for k in ("inputs_embeds", "positions", "temperature", "top_k", "top_p", "noise"):
            one[k][0] = both[k][row]
        one["heads"] = both["heads"]
        predictor.plan(one).run()
        assert np.array_equal(one["codes"][0], both["codes"][row])
        assert np.allclose(one["hidden"][0], both["hidden"][row], atol=1e-5)


def test_plan_checks_every_binding(artifact, backend, predictor):
    bufs = _predictor_buffers(artifact, backend, 2)
    with pytest.raises(EngineError, match=r"code_predictor\.onnx: bindings missing \['hidden'\]"):
        predictor.plan({k: v for k, v in bufs.items() if k != "hidden"})
    with pytest.raises(EngineError, match="unknown \\['bogus'\\]"):
        predictor.plan({**bufs, "bogus": bufs["hidden"]})
    with pytest.raises(EngineError, match="tensor positions is int64, buffer is int32"):
        predictor.plan({**bufs, "positions": bufs["positions"].astype(np.int32)})
    width = bufs["hidden"].shape[2]
    with pytest.raises(EngineError, match="tensor hidden has shape"):
        predictor.plan({**bufs, "hidden": backend.empty((2, 1, width + 1), np.float32)})
    with pytest.raises(EngineError, match="buffer for hidden is not contiguous"):
        wide = backend.empty((2, 1, width * 2), np.float32)
        predictor.plan({**bufs, "hidden": wide[:, :, ::2]})


def test_dynamic_prefill_length(artifact, backend):
    """The talker engine serves a prefill of any length up to max_seq (one member at position 0 over a
    one-slot cache the mask hides); outputs are sized by the binding."""
    engine = backend.load(artifact.file("talker"))
    d = artifact.dims
    for t in (1, 7, 40):
        e = backend.empty
        bufs = {"inputs_embeds": e((1, t, d.hidden), np.float32), "positions": e((1,), np.int64),
                "slots": e((1,), np.int64),
                "seen": e((1, d.vocab), np.float32),
                "repetition_penalty": e((1,), np.float32), "allow_eos": e((1,), np.bool_),
                "temperature": e((1,), np.float32), "top_k": e((1,), np.int64), "top_p": e((1,), np.float32),
                "noise": e((1, d.vocab), np.float32), "hidden": e((1, d.hidden), np.float32), "code0": e((1,), np.int64)}
        bufs["inputs_embeds"][:] = np.random.default_rng(t).standard_normal(bufs["inputs_embeds"].shape)
        bufs["repetition_penalty"][:] = 1.0
        bufs["top_p"][:] = 1.0
        for i in range(d.layers):
            bufs[f"past_keys_{i}"] = e((1, d.kv_heads, d.head_dim, 1), np.float32)
            bufs[f"past_values_{i}"] = e((1, d.kv_heads, 1, d.head_dim), np.float32)
            bufs[f"new_keys_{i}"] = e((1, d.kv_heads, d.head_dim, t), np.float32)
            bufs[f"new_values_{i}"] = e((1, d.kv_heads, t, d.head_dim), np.float32)
        engine.plan(bufs, repeated=False).run()
        assert 0 <= bufs["code0"][0] < 2048
        assert np.abs(bufs[f"new_values_{d.layers - 1}"]).sum() > 0


def test_copy_and_zero_move_rows_in_and_out_of_device_buffers(backend):
    """What the vocoder does with its state, and what `copy` promises for any 2-D copy (the code
    predictor's drafts), on buffers that on TensorRT are device memory the host never touches: a K
    column and a V row written, a block copied in, a buffer zeroed; read back through `copy` into host
    buffers once `sync()` says the copies ran."""
    rng = np.random.default_rng(3)
    keys, values = backend.device_empty((2, 3, 8, 16), np.float32), backend.device_empty((2, 3, 16, 8), np.float32)
    new_k, new_v = backend.empty((2, 3, 8, 1), np.float32), backend.empty((2, 3, 1, 8), np.float32)
    block = backend.empty((3 * 8 * 4,), np.float32)
    new_k[...], new_v[...], block[...] = rng.random(new_k.shape), rng.random(new_v.shape), rng.random(block.shape)
    backend.copy(keys[1, :, :, 5], new_k[1, :, :, 0])
    backend.copy(values[1, :, 5], new_v[1, :, 0])
    backend.copy(keys[0, :, :, :4], block.reshape(3, 8, 4))
    want_k, want_v = np.zeros(keys.shape, np.float32), np.zeros(values.shape, np.float32)
    want_k[1, :, :, 5], want_v[1, :, 5], want_k[0, :, :, :4] = new_k[1, :, :, 0], new_v[1, :, 0], block.reshape(3, 8, 4)
    got_k, got_v = backend.empty(keys.shape, np.float32), backend.empty(values.shape, np.float32)
    backend.copy(got_k, keys)
    backend.copy(got_v, values)
    backend.sync()
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)
    backend.zero(keys)
    backend.copy(got_k, keys)
    backend.sync()
    assert not got_k.any()
    with pytest.raises(EngineError, match=r"copy: \[3, 4, 4\] with strides .* is not a 2-D copy"):
        backend.copy(keys[0, :, :4, :4], block[:48].reshape(3, 4, 4))
    with pytest.raises(EngineError, match=r"copy: float32\[3, 8\] into float32\[3, 4\]"):
        backend.copy(keys[0, :, :4, 0], new_k[1, :, :, 0])


def test_a_plan_appends_its_rows_at_each_members_position(artifact, backend, predictor):
    """A plan's `Append`: after the engine runs, each active member's new K and V rows are in its
    cache at that member's own position (a member not active keeps its cache; the other members'
    slots are untouched): what a decode step does with the talker's cache, on the device."""
    bufs = _predictor_buffers(artifact, backend, 2, seed=4)
    caches, rows = [], []
    for name in sorted(n for n in bufs if n.startswith("new_")):
        out = bufs[name] = backend.device_empty(bufs[name].shape, np.float32)
        axis = 3 if name.startswith("new_keys") else 2
        shape = list(out.shape)
        shape[0], shape[axis] = 3, 6  # three members' caches of six slots
        caches.append(backend.device_empty(tuple(shape), np.float32))
        rows.append(Rows(caches[-1], out, axis))
    positions, active = backend.empty((2,), np.int64), backend.empty((2,), np.uint8)
    positions[:], active[:] = (4, 1), (1, 1)
    plan = predictor.plan(bufs, repeated=False, append=Append(tuple(rows), positions, active=active))
    plan.run()
    active[:] = (0, 1)
    positions[:] = (0, 2)
    plan.run()  # member 0 is not active: its rows at 0 stay unwritten
    for r in rows:
        got, new = backend.empty(r.cache.shape, np.float32), backend.empty(r.rows.shape, np.float32)
        backend.copy(got, r.cache)
        backend.copy(new, r.rows)
        backend.sync()
        want = np.zeros(r.cache.shape, np.float32)
        t = r.rows.shape[r.axis]
        for m, position in ((0, 4), (1, 1), (1, 2)):
            index = (m,) + (slice(None),) * (r.axis - 1) + (slice(position, position + t),)
            want[index] = new[m]
        assert np.array_equal(got, want)
