"""Shared fixtures: tiny random checkpoints built with the reference classes, and their artifacts.

Building and exporting take seconds each, so both are built once per test run, in a directory every
pytest-xdist worker shares (support/built_once.py), and kept in memory per worker.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from support.built_once import built_once, shared_root

# Tests never reach a model hub; every checkpoint here is a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if importlib.util.find_spec("torch") is not None:
    import torch

    # One thread: the tiny models gain nothing from more, and on small VMs an OpenMP team of 2 can
    # stall ~15 ms per 2-row matmul while its idle thread wakes up (seen with torch 2.13 + MKL).
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    out = shared_root(tmp_path_factory.getbasetemp()) / "engines"
    out.mkdir(exist_ok=True)
    return out


@pytest.fixture(scope="session", autouse=True)
def export_memo(build_dir):
    """Vocoder graphs exported once per run for each distinct codec (engines/export_memo.py; the
    checkpoints of a shape variant share theirs); a test that compares two exports turns it off."""
    from engines.export_memo import ENV

    os.environ[ENV] = str(build_dir / "export-memo")
    yield
    os.environ.pop(ENV, None)


@pytest.fixture(scope="session")
def checkpoints(build_dir):
    """checkpoints(variant, seed=0, kind="custom_voice") -> a tiny checkpoint directory (built once;
    kind "base": a Base checkpoint, for voice cloning)."""
    from engines.tiny import build_tiny

    cache: dict[tuple[int, int, str], Path] = {}

    def get(variant: int, seed: int = 0, kind: str = "custom_voice") -> Path:
        key = (variant, seed, kind)
        if key not in cache:
            suffix = "" if kind == "custom_voice" else f"-{kind}"
            cache[key] = built_once(build_dir / f"ckpt-v{variant}-s{seed}{suffix}",
                                    lambda out: build_tiny(out, seed, variant, kind=kind))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def artifacts(build_dir, checkpoints):
    """artifacts(variant, seed=0, kind="custom_voice") -> an exported artifact directory (exported once)."""
    from engines.export import export

    cache: dict[tuple[int, int, str], Path] = {}

    def get(variant: int, seed: int = 0, kind: str = "custom_voice") -> Path:
        key = (variant, seed, kind)
        if key not in cache:
            out = build_dir / (f"art-v{variant}-s{seed}" + ("" if kind == "custom_voice" else f"-{kind}"))
            ckpt = checkpoints(variant, seed, kind)
            cache[key] = built_once(out, lambda out: export(ckpt, out, max_batch=4, max_seq=256))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def omni_artifacts(build_dir):
    """omni_artifacts(variant, seed) -> (a tiny Qwen3-Omni checkpoint, its exported artifact), built and
    exported once for the session (max_batch 4, max_seq 256); an Omni export is tens of seconds."""
    from engines.export import export
    from engines.tiny import build_tiny

    cache: dict[tuple[int, int], tuple[Path, Path]] = {}

    def get(variant: int, seed: int) -> tuple[Path, Path]:
        if (variant, seed) not in cache:
            ckpt = built_once(build_dir / f"omni-ckpt-v{variant}-s{seed}",
                              lambda out: build_tiny(out, seed, variant, family_name="qwen3_omni"))
            out = built_once(build_dir / f"omni-art-v{variant}-s{seed}", lambda out: export(ckpt, out, max_batch=4, max_seq=256))
            cache[variant, seed] = ckpt, out
        return cache[variant, seed]

    return get


EOS_TEXT = "Hello world, this is edged speaking."


@pytest.fixture(scope="session")
def eos_artifact(build_dir, checkpoints) -> tuple[Path, Path]:
    """(checkpoint, artifact): the tiny checkpoint of variant 0 (the built-in model's) whose eos logit
    row is 1.5x the row of the code greedy decoding picks at frame 12 of EOS_TEXT, so that greedy
    decoding stops where it would have chosen that code, at text-dependent points; exported once
    (max_batch 2, max_seq 128)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from edged.artifact import load_artifact
    from edged.backends import make_backend
    from edged.request import Sampling, SpeechRequest
    from edged.synth import Synthesizer
    from engines.export import export

    def eos_checkpoint(ckpt: Path) -> None:
        synth = Synthesizer(load_artifact(None), make_backend("onnxruntime", 1))
        (plain,) = synth.synthesize([SpeechRequest(id="p", text=EOS_TEXT, voice="vivian", language="english",
                                                   sampling=Sampling.greedy(), max_frames=16)])
        shutil.copytree(checkpoints(0), ckpt)
        weights = load_file(ckpt / "model.safetensors")
        head = weights["talker.codec_head.weight"]
        eos = json.loads((ckpt / "config.json").read_text())["talker_config"]["codec_eos_token_id"]
        head[eos] = head[int(plain.frames[12, 0])] * 1.5
        save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})

    ckpt = built_once(build_dir / "ckpt-eos", eos_checkpoint)
    art = built_once(build_dir / "art-eos", lambda out: export(ckpt, out, max_batch=2, max_seq=128))
    return ckpt, art


@pytest.fixture(scope="session")
def builtin_artifact() -> Path:
    """The built-in tiny artifact (or EDGED_TEST_ARTIFACT, for device validation)."""
    from edged.artifact import BUILTIN

    return Path(os.environ.get("EDGED_TEST_ARTIFACT", BUILTIN))


@pytest.fixture(scope="session")
def backend():
    """The backend under test: onnxruntime here, tensorrt on a device (EDGED_TEST_BACKEND)."""
    from edged.backends import make_backend

    return make_backend(os.environ.get("EDGED_TEST_BACKEND", "onnxruntime"), threads=1)


@pytest.fixture(scope="session")
def tiny_reference(checkpoints):
    """tiny_reference(variant=0, seed=0, kind="custom_voice") -> the qwen-tts `Qwen3TTSModel` of that
    checkpoint, loaded once."""
    from engines.qwen3_tts.reference import load_reference

    loaded: dict = {}

    def get(variant: int = 0, seed: int = 0, kind: str = "custom_voice"):
        key = (variant, seed, kind)
        if key not in loaded:
            loaded[key] = load_reference(checkpoints(variant, seed, kind))
        return loaded[key]

    return get
