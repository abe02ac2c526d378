"""Qwen3-Omni's MoE talker, as exported (engines.qwen3_omni + the shared talker graph module), equals
transformers' own talker on tiny random checkpoints of three shapes (experts, top-k, layers, code
groups): a prefill, then decode steps over the cache the runtime would hold."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engines.qwen3_omni.model import load_qwen3_omni
from engines.qwen3_omni.tiny import VARIANTS, build_model
from engines.talker import TalkerStep


def run_ours(step: TalkerStep, rows: torch.Tensor, positions: int, cache: list[torch.Tensor]):
    """One graph call: `rows` [1, T, H] at `positions`, over `cache`; greedy sampling inputs."""
    vocab = step.talker.codec_head.out_features
    slots = torch.zeros(cache[1].shape[2], dtype=torch.long)  # attend every bound slot
    hidden, code0, *new = step(rows, torch.tensor([positions]), slots, torch.zeros(1, vocab), torch.ones(1),
                               torch.ones(1, dtype=torch.bool), torch.zeros(1), torch.zeros(1, dtype=torch.long),
                               torch.ones(1), torch.rand(1, vocab), *cache)
    return hidden, code0, new


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_the_moe_talker_equals_the_library(tmp_path, variant):
    model = build_model(seed=variant, variant=variant)
    model.save_pretrained(tmp_path)
    cfg, talker, _, _ = load_qwen3_omni(tmp_path)
    step = TalkerStep(talker).eval()
    reference = model.talker
    c = cfg.talker
    torch.manual_seed(7)
    prompt = torch.randn(1, 9, c.hidden)
    steps = [torch.randn(1, 1, c.hidden) for _ in range(3)]
    slots = 16
    keys = [torch.zeros(1, c.kv_heads, c.head_dim, slots) for _ in range(c.layers)]
    values = [torch.zeros(1, c.kv_heads, slots, c.head_dim) for _ in range(c.layers)]
    with torch.no_grad():
        out = reference.model(inputs_embeds=prompt, use_cache=True)
        past = out.past_key_values
        want = [out.last_hidden_state[:, -1]]
        for x in steps:
            out = reference.model(inputs_embeds=x, past_key_values=past, use_cache=True)
            want.append(out.last_hidden_state[:, -1])
        none = [t for _ in range(c.layers) for t in (torch.zeros(1, c.kv_heads, c.head_dim, 1),
                                                     torch.zeros(1, c.kv_heads, 1, c.head_dim))]
        hidden, _, new = run_ours(step, prompt, 0, none)
        got = [hidden]
        for i in range(c.layers):
            keys[i][..., :9], values[i][:, :, :9] = new[2 * i], new[2 * i + 1]
        for k, x in enumerate(steps):
            position = 9 + k
            hidden, _, new = run_ours(step, x, position, [t for i in range(c.layers) for t in (keys[i], values[i])])
            got.append(hidden)
            for i in range(c.layers):
                keys[i][..., position], values[i][:, :, position] = new[2 * i][..., 0], new[2 * i + 1][:, :, 0]
        for w, g in zip(want, got):
            assert w.abs().max() > 0.1 and torch.allclose(w, g, atol=2e-5), (w - g).abs().max()
            assert torch.allclose(reference.codec_head(w), talker.codec_head(g), atol=2e-5)


def test_the_exported_graphs_run_on_onnx_runtime_as_in_torch(tmp_path):
    """The MoE talker graph (TopK routing mask, every expert as two concatenated matmuls, the gated
    shared expert) and the code-predictor pass, exported and run on ONNX Runtime: a prefill and a
    batched decode step give torch's hidden and greedy codes, and a frame of passes torch's frame."""
    import numpy as np
    import onnxruntime as ort

    from engines.talker import export_predictor, export_talker

    model = build_model(seed=3, variant=1)
    model.save_pretrained(tmp_path / "ckpt")
    cfg, talker, predictor, tables = load_qwen3_omni(tmp_path / "ckpt")
    c, slots = cfg.talker, 32
    export_talker(talker, tmp_path / "talker.onnx", slots)
    export_predictor(predictor, tmp_path / "code_predictor.onnx")
    step = TalkerStep(talker).eval()
    rng = np.random.default_rng(0)
    for b, t, position, past in ((1, 7, 0, 1), (3, 1, 5, slots)):
        feeds = {
            "inputs_embeds": rng.standard_normal((b, t, c.hidden), dtype=np.float32),
            "positions": np.full(b, position, dtype=np.int64), "slots": np.zeros(past, np.int64),
            "seen": np.zeros((b, cfg.vocab), np.float32),
            "repetition_penalty": np.full(b, 1.05, np.float32), "allow_eos": np.ones(b, dtype=bool),
            "temperature": np.zeros(b, np.float32), "top_k": np.zeros(b, np.int64), "top_p": np.ones(b, np.float32),
            "noise": rng.random((b, cfg.vocab), dtype=np.float32),
        }
        for i in range(c.layers):
            feeds[f"past_keys_{i}"] = rng.standard_normal((b, c.kv_heads, c.head_dim, past), dtype=np.float32)
            feeds[f"past_values_{i}"] = rng.standard_normal((b, c.kv_heads, past, c.head_dim), dtype=np.float32)
        session = ort.InferenceSession(str(tmp_path / "talker.onnx"), providers=["CPUExecutionProvider"])
        hidden, code0 = session.run(["hidden", "code0"], feeds)
        with torch.no_grad():
            want_hidden, want_code0, *_ = run_feeds(step, feeds)
        assert np.abs(hidden - want_hidden.numpy()).max() < 1e-4 and np.array_equal(code0, want_code0.numpy())
    assert_predictor_passes_equal_the_frame(predictor, tables, tmp_path / "code_predictor.onnx", rng)


def assert_predictor_passes_equal_the_frame(predictor, tables, path, rng) -> None:
    """The code-predictor pass graph, driven pass by pass (engines.talker.predict_frame), gives the
    torch frame's greedy codes and codec sum."""
    import numpy as np
    import onnxruntime as ort

    from engines.talker import predict_frame, predictor_cache

    cfg = predictor.cfg
    b, g = 2, cfg.code_groups
    hidden, code0 = rng.standard_normal((b, cfg.talker.hidden), dtype=np.float32), np.array([5, 900])
    sampling = {"temperature": np.zeros(b, np.float32), "top_k": np.zeros(b, np.int64), "top_p": np.ones(b, np.float32)}
    noise = rng.random((b, g - 1, cfg.codebook_size), dtype=np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cache = predictor_cache(session.get_inputs(), b, g)
    tables = {k: tables[k].numpy() for k in ("codec_embedding", "cp_heads", "cp_codec_embedding")}
    codes, codec_sum = predict_frame(lambda feeds: session.run(None, feeds), hidden, code0, tables, g, cache, sampling,
                                     noise)
    with torch.no_grad():
        want_codes, want_sum = predictor(*(torch.from_numpy(v) for v in (hidden, code0, *sampling.values(), noise)))
    assert np.array_equal(codes, want_codes.numpy()) and np.abs(codec_sum - want_sum.numpy()).max() < 1e-4


def run_feeds(step: TalkerStep, feeds: dict):
    return step(*(torch.from_numpy(v) for v in feeds.values()))


def test_edged_engines_exports_an_omni_artifact(tmp_path):
    """`edged-engines tiny --family qwen3_omni` then `export`: the manifest (family, segments layout, the
    code2wav's lead, the checkpoint's ids and speakers), the host tables equal to the library's
    projections of the thinker's embeddings, and the graphs the manifest lists."""
    import json

    from safetensors.numpy import load_file

    from edged.artifact.manifest import Manifest
    from engines.cli import main

    ckpt, art = tmp_path / "ckpt", tmp_path / "art"
    assert main(["tiny", "--family", "qwen3_omni", "--variant", "2", "--seed", "4", "--out", str(ckpt)]) == 0
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(art), "--max-seq", "64"]) == 0
    m = Manifest.from_json(json.loads((art / "artifact.json").read_text()))
    config = json.loads((ckpt / "config.json").read_text())
    assert (m.family, m.layout, m.lead_samples, m.max_seq) == ("qwen3_omni", "segments", 555, 64)
    assert m.special["tts_pad"] == config["tts_pad_token_id"] and m.special["user"] == config["user_token_id"]
    assert {k: s.id for k, s in m.speakers.items()} == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    thinker_vocab = config["thinker_config"]["text_config"]["vocab_size"]
    assert m.dims.code_groups == VARIANTS[2]["groups"] and m.dims.text_vocab == thinker_vocab
    assert all((art / g.file).is_file() for g in m.graphs.values()) and m.graphs["vocoder"].state
    tables = load_file(str(art / "embeddings.safetensors"))
    model = build_model(seed=4, variant=2)
    ids = torch.tensor([m.special["tts_pad"], m.special["im_start"], 100])
    with torch.no_grad():
        want = model.talker.text_projection(model.thinker.model.embed_tokens(ids)).numpy()
    assert abs(tables["text_projected"][ids.numpy()] - want).max() < 1e-6
    assert tables["hidden_projection.fc1.weight"].shape == (48, 32)
