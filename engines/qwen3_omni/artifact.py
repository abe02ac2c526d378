"""A Qwen3-Omni checkpoint -> engine artifact: the MoE talker, the code predictor and the streaming
code2wav as ONNX graphs, the host tables, the tokenizer, and `artifact.json` (family `qwen3_omni`,
layout `segments`, `audio.lead_samples` the code2wav's 555).

Tables: `text_projected` = text_projection(thinker embed_tokens(x)) for every text token, computed
here as the reference computes it (row-wise, so exact; [text_vocab, hidden] instead of the thinker's
[text_vocab, thinker_hidden] table plus an MLP per request), the talker's `codec_embedding`, and
`hidden_projection.*` (the MLP that turns the thinker's hidden states of media placeholders into
talker rows; they arrive per request). Only `talker.*`, `code2wav.*` and the thinker's embed_tokens
are read: the thinker itself is not needed (engines/hub.py fetches only the shards holding these).
The tokenizer is the checkpoint's tokenizer.json, or the one its vocab.json and merges.txt make.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from edged.artifact.manifest import Dims, Manifest, Speaker
from engines.config import ConfigError
from engines.qwen3_omni.codec import load_omni_codec
from engines.qwen3_omni.config import Qwen3OmniConfig
from engines.qwen3_omni.model import TABLES, modules, weights
from engines.qwen3_tts.artifact import graph_specs, write_tables
from engines.qwen3_tts.codec_export import export_codec
from engines.talker import export_draft, export_predictor, export_talker

FILES = {"talker": "talker.onnx", "code_predictor": "code_predictor.onnx",
         "code_predictor_draft": "code_predictor_draft.onnx", "vocoder": "vocoder.onnx",
         "embeddings": "embeddings.safetensors", "tokenizer": "tokenizer.json"}
SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
            "cp_temperature": 1.0, "cp_top_k": 50, "cp_top_p": 0.8}
"""The library's generate: talker_* defaults, and the code predictor's hard-coded sampling."""


def export(checkpoint: Path, out: Path, *, max_batch: int = 4, max_seq: int = 1024) -> Manifest:
    """Write the artifact for `checkpoint` into `out` and return its manifest."""
    checkpoint, out = Path(checkpoint), Path(out)
    if max_batch < 1 or max_seq < 16:
        raise ValueError(f"max_batch must be >= 1 and max_seq >= 16 (got {max_batch}, {max_seq})")
    cfg = Qwen3OmniConfig.from_checkpoint(checkpoint)
    if not any((checkpoint / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        raise ConfigError(f"{checkpoint}: no tokenizer.json and no vocab.json with merges.txt (the text tokenizer)")
    talker, predictor = modules(cfg)
    source = weights(checkpoint, cfg, talker, predictor)
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        tensors = {
            "talker": export_talker(talker, out / FILES["talker"], max_seq, source),
            "code_predictor": export_predictor(predictor, out / FILES["code_predictor"], source),
            "code_predictor_draft": export_draft(predictor, out / FILES["code_predictor_draft"]),
            "vocoder": export_codec(load_omni_codec(checkpoint, cfg.codec), out / FILES["vocoder"]),
        }
        write_tables(out / FILES["embeddings"], source, cfg.text_vocab, cfg.talker.hidden,
                     extra=tuple(n for n in TABLES if n.startswith("hidden_projection.")))
    export_tokenizer(checkpoint, out / FILES["tokenizer"])
    manifest = _manifest(cfg, tensors, max_batch, max_seq)
    (out / "artifact.json").write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


def export_tokenizer(checkpoint: Path, path: Path) -> None:
    """The checkpoint's tokenizer.json, or, of a checkpoint with only the slow tokenizer's files
    (vocab.json, merges.txt, tokenizer_config.json), the fast tokenizer the library's processor
    builds from them (AutoTokenizer: Qwen2TokenizerFast)."""
    if (checkpoint / "tokenizer.json").is_file():
        shutil.copyfile(checkpoint / "tokenizer.json", path)
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(checkpoint)).backend_tokenizer.save(str(path))


def _manifest(cfg: Qwen3OmniConfig, tensors: dict, max_batch: int, max_seq: int) -> Manifest:
    t = cfg.talker
    media = {"audio_token": cfg.media["audio_token_id"], "image_token": cfg.media["image_token_id"],
             "video_token": cfg.media["video_token_id"]}
    return Manifest(
        family="qwen3_omni", model_type="omni", supports_instruct=False, precision="fp32",
        dims=Dims(hidden=t.hidden, layers=t.layers, kv_heads=t.kv_heads, head_dim=t.head_dim, vocab=cfg.vocab,
                  text_vocab=cfg.text_vocab, text_hidden=cfg.thinker_hidden, code_groups=cfg.code_groups,
                  codebook_size=cfg.codebook_size),
        max_batch=max_batch, max_seq=max_seq, special={**cfg.special, **media},
        speakers={name: Speaker(i) for name, i in cfg.speakers.items()}, languages={},
        sample_rate=cfg.codec.output_sample_rate, samples_per_frame=cfg.codec.samples_per_frame, sampling=dict(SAMPLING),
        graphs=graph_specs(FILES, tensors), files={"embeddings": FILES["embeddings"], "tokenizer": FILES["tokenizer"]},
        layout="segments", lead_samples=cfg.codec.lead_samples,
    )
