"""Weights as distributed: a checkpoint sharded with model.safetensors.index.json, its tensors in bf16
and fp16, reads every tensor as the same values in one fp32 file, and exports and speaks (Qwen3-TTS;
a Qwen3-Omni one reads every tensor as the one file holds it); Qwen3-Omni's experts read the same
from per-expert tensors and from transformers 5.x's fused ones; tensors are read one at a time, from
the shard that holds them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file

from edged.artifact import load_artifact
from edged.request import Sampling, SpeechRequest
from edged.synth import Synthesizer
from engines.config import CheckpointError
from engines.export import export
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_omni.model import experts
from engines.qwen3_omni.tiny import build_model
from engines.weights import INDEX, Checkpoint

SHARDS = 3


def stored(key: str) -> torch.dtype:
    """The dtype a tensor is distributed in here: bf16, with every third key fp16."""
    return torch.float16 if sum(map(ord, key)) % 3 == 0 else torch.bfloat16


def distribute(source: Path, sharded: Path, single: Path) -> None:
    """`source` twice: its weights rounded to their distributed dtypes (`stored`) and written in
    SHARDS files with an index, as save_pretrained shards them; and the same values as float32 in one
    model.safetensors. Everything else is linked."""
    for dest in (sharded, single):
        for path in source.iterdir():
            if path.name != "model.safetensors":
                (dest / path.name).parent.mkdir(parents=True, exist_ok=True)
                (dest / path.name).symlink_to(path)
    weights = {k: v.to(stored(k)) for k, v in load_file(str(source / "model.safetensors")).items()}
    keys = sorted(weights)
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    weight_map = {key: names[i * SHARDS // len(keys)] for i, key in enumerate(keys)}
    for name in names:
        save_file({k: weights[k] for k in keys if weight_map[k] == name}, str(sharded / name), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in weights.values())
    (sharded / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    save_file({k: v.float() for k, v in weights.items()}, str(single / "model.safetensors"))


def reads_alike(a: Checkpoint, b: Checkpoint, every: int) -> None:
    """Every `every`-th tensor (and rows 1:3 of it) reads from `a` as float32 equal to `b`'s."""
    assert set(a.files) == set(b.files)
    for key in sorted(a.files)[::every]:
        tensor = a.read(key)
        assert tensor.dtype == torch.float32 and torch.equal(tensor, b.read(key)), key
        assert torch.equal(a.read(key, slice(1, 3)), tensor[1:3]), key


def frames(artifact: Path, voice: str) -> tuple[np.ndarray, np.ndarray]:
    from edged.backends import make_backend

    request = SpeechRequest(id="r", text="Hello world, this is edged speaking.", voice=voice,
                            sampling=Sampling.greedy(), max_frames=12)
    result = Synthesizer(load_artifact(artifact), make_backend("onnxruntime", threads=1)).synthesize([request])[0]
    return result.frames, result.pcm


def test_a_sharded_bf16_checkpoint_reads_as_the_same_values_in_one_fp32_file_and_speaks(checkpoints, tmp_path):
    """Every tensor reads from its shard as from the one fp32 file (the export reads weights only
    through Checkpoint.read, so equal reads export equal artifacts), and the export through the
    index speaks."""
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    distribute(checkpoints(0), sharded, single)
    assert {path.name for path in Checkpoint(sharded).files.values()} == {
        f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)}
    reads_alike(Checkpoint(sharded), Checkpoint(single), every=1)
    export(sharded, tmp_path / "a", max_batch=2, max_seq=64)
    codes, pcm = frames(tmp_path / "a", "vivian")
    assert codes.shape[0] > 1 and len(pcm) > 0 and np.isfinite(pcm).all()


def test_a_sharded_bf16_omni_checkpoint_reads_as_one_fp32_file(omni_artifacts, tmp_path):
    """The Qwen3-TTS case above shows that equal reads export equal artifacts; here every tensor of
    the Omni checkpoint reads from its shard as from the one file. A sharded Omni checkpoint with no
    model.safetensors, every loader through the index, is exported in tests/engines/test_hub.py."""
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    distribute(omni_artifacts(2, 22)[0], sharded, single)
    reads_alike(Checkpoint(sharded), Checkpoint(single), every=1)
    assert not (sharded / "model.safetensors").exists()


def test_a_tensor_is_read_from_its_shard_as_float32(checkpoints, tmp_path):
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    distribute(checkpoints(0), sharded, single)
    reads_alike(Checkpoint(sharded), Checkpoint(single), every=7)


def test_a_shard_the_index_names_must_exist_when_a_tensor_in_it_is_read(checkpoints, tmp_path):
    """A checkpoint fetched for one export holds only the shards it reads (engines/hub.py): a missing
    shard is an error when, and only when, a tensor in it is read."""
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    distribute(checkpoints(0), sharded, single)
    missing = f"model-00002-of-{SHARDS:05d}.safetensors"
    (sharded / missing).unlink()
    store = Checkpoint(sharded)
    there = next(key for key, path in store.files.items() if path.name != missing)
    assert torch.equal(store.read(there), Checkpoint(single).read(there))
    key = next(key for key, path in store.files.items() if path.name == missing)
    with pytest.raises(CheckpointError, match=f"{missing}: named by {INDEX} but missing \\(it holds '{key}'\\)"):
        store.read(key)
    with pytest.raises(CheckpointError, match=f"{missing}: named by {INDEX} but missing"):
        export(sharded, tmp_path / "a", max_batch=2, max_seq=64)


def test_a_tensor_stored_in_another_type_is_refused_naming_it(checkpoints, tmp_path):
    weights = load_file(str(checkpoints(0) / "model.safetensors"))
    key = "talker.codec_head.weight"
    save_file({**weights, key: weights[key].to(torch.float64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"model.safetensors: '{key}' is stored as F64"):
        Checkpoint(tmp_path).read(key)


def test_omni_experts_read_the_same_from_per_expert_and_fused_tensors(tmp_path):
    """transformers 5.x can save the experts fused (`save_original_format=False`): gate_up_proj
    [E, 2I, H] (gate rows first) and down_proj [E, H, I] per layer."""
    source = tmp_path / "per-expert"
    build_model(seed=2, variant=1, tokenizer_dir=source).save_pretrained(source)
    cfg = Qwen3OmniConfig.from_checkpoint(source)
    weights = load_file(str(source / "model.safetensors"))
    fused = dict(weights)
    for layer in range(cfg.talker.layers):
        base = f"talker.model.layers.{layer}.mlp.experts"
        take = {p: [fused.pop(f"{base}.{e}.{p}_proj.weight") for e in range(cfg.moe.experts)]
                for p in ("gate", "up", "down")}
        fused[f"{base}.gate_up_proj"] = torch.stack([torch.cat(pair) for pair in zip(take["gate"], take["up"])])
        fused[f"{base}.down_proj"] = torch.stack(take["down"])
    (tmp_path / "fused").mkdir()
    save_file(fused, str(tmp_path / "fused" / "model.safetensors"))
    a, b = Checkpoint(source), Checkpoint(tmp_path / "fused")
    for layer in range(cfg.talker.layers):
        for proj in ("gate", "up", "down"):
            per_expert, from_fused = experts(a, cfg, layer, proj), experts(b, cfg, layer, proj)
            assert len(per_expert.keys) == cfg.moe.experts and len(from_fused.keys) == 1
            made = [s.make([x.read(k) for k in s.keys]) for s, x in ((per_expert, a), (from_fused, b))]
            assert made[0].shape == per_expert.out == from_fused.out and torch.equal(*made)
