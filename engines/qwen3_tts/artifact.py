"""A Qwen3-TTS checkpoint -> engine artifact: ONNX graphs, host-side tables, tokenizer, `artifact.json`.

The graph contracts are documented in docs/artifact.md; the manifest is written from the runtime's
own definition (`edged.artifact.manifest`), which validates it on load.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from edged.artifact.manifest import Dims, Graph, Manifest, Speaker, StateSpec
from engines.qwen3_tts.config import Qwen3TTSConfig
from engines.qwen3_tts.model import modules, weights
from engines.talker import export_draft, export_predictor, export_talker
from engines.weights import Weights, write_safetensors

FILES = {
    "talker": "talker.onnx",
    "code_predictor": "code_predictor.onnx",
    "code_predictor_draft": "code_predictor_draft.onnx",
    "vocoder": "vocoder.onnx",
    "speaker_encoder": "speaker_encoder.onnx",
    "codec_encoder": "codec_encoder.onnx",
    "embeddings": "embeddings.safetensors",
    "tokenizer": "tokenizer.json",
}
def export(checkpoint: Path, out: Path, *, max_batch: int = 4, max_seq: int = 1024) -> Manifest:
    """Write the artifact for `checkpoint` into `out` and return its manifest. The talker and code
    predictor are exported from their shapes and their weights streamed from the checkpoint one
    tensor at a time (engines/weights.py, engines/onnx.py)."""
    from engines.qwen3_tts.codec_export import export_vocoder

    checkpoint, out = Path(checkpoint), Path(out)
    if max_batch < 1 or max_seq < 16:
        raise ValueError(f"max_batch must be >= 1 and max_seq >= 16 (got {max_batch}, {max_seq})")
    cfg = Qwen3TTSConfig.from_checkpoint(checkpoint)
    talker, predictor = modules(cfg)
    source = weights(checkpoint, cfg, talker, predictor)
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        tensors = {
            "talker": export_talker(talker, out / FILES["talker"], max_seq, source),
            "code_predictor": export_predictor(predictor, out / FILES["code_predictor"], source),
            "code_predictor_draft": export_draft(predictor, out / FILES["code_predictor_draft"]),
            "vocoder": export_vocoder(checkpoint, out / FILES["vocoder"]),  # stateful: lists its state
        }
        if cfg.model_type == "base":
            tensors.update(export_clone_encoder(checkpoint, out))
        write_tables(out / FILES["embeddings"], source, cfg.text_vocab, cfg.talker.hidden)
    _export_tokenizer(checkpoint, out / FILES["tokenizer"])
    manifest = _manifest(cfg, tensors, max_batch, max_seq)
    (out / "artifact.json").write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


# ----------------------------------------------------------------------------------------- graphs


def export_clone_encoder(checkpoint: Path, out: Path) -> dict[str, dict]:
    """A Base checkpoint's clone encoder: the speaker encoder (PCM -> x-vector, its mel front end
    inside) and the speech tokenizer's encoder (PCM -> codec frames), from qwen-tts's own modules."""
    from engines.qwen3_tts.reference import load_reference
    from engines.qwen3_tts.speaker_export import export_speaker_encoder
    from engines.qwen3_tts.speech_encoder_export import export_speech_encoder

    model = load_reference(checkpoint).model
    export_speaker_encoder(model.speaker_encoder, out / FILES["speaker_encoder"])
    export_speech_encoder(model.speech_tokenizer, out / FILES["codec_encoder"])
    return {"speaker_encoder": {"inputs": ["pcm"], "outputs": ["xvector"]},
            "codec_encoder": {"inputs": ["pcm"], "outputs": ["codes"]}}


def add_clone_encoder(artifact_dir: Path, checkpoint: Path) -> None:
    """Give an exported artifact the clone encoder of `checkpoint` (a Base checkpoint whose speech
    tokenizer is the artifact's own: its codes must be the vocoder's). The built-in demo artifact is
    a CustomVoice export with the clone encoder of its Base twin, so a fresh install can enroll voices."""
    from edged.artifact.manifest import Manifest

    path = artifact_dir / "artifact.json"
    manifest = Manifest.from_json(json.loads(path.read_text()))
    graphs = {**manifest.graphs, **graph_specs(FILES, export_clone_encoder(checkpoint, artifact_dir))}
    path.write_text(json.dumps(replace(manifest, graphs=graphs).to_json(), indent=2) + "\n")


# ----------------------------------------------------------------------------------------- host side


PROJECTED_ROWS = 8192
"""Text-embedding rows projected at a time."""


def write_tables(path: Path, source: Weights, text_vocab: int, hidden: int, extra: tuple[str, ...] = ()) -> None:
    """embeddings.safetensors, each table made as it is written: the projected text table
    `text_projected` = text_projection(text_embedding(x)) for every text token (tts_bos/eos/pad are
    rows of it), the talker's codec embedding, the code predictor's tables and the family's `extra`.

    The projection acts on each token alone, so precomputing it (in torch, as the reference computes
    it) turns a per-request MLP into a row lookup, and the table is smaller than the embedding it
    replaces (hidden <= text_hidden); the embedding is read PROJECTED_ROWS rows at a time."""
    def projected():
        mlp = {k: source.tensor(f"text_projection.{k}") for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
        for start in range(0, text_vocab, PROJECTED_ROWS):
            rows = source.rows("text_embedding", slice(start, min(start + PROJECTED_ROWS, text_vocab)))
            yield project(mlp, rows).numpy()

    def whole(name: str):
        yield source.tensor(name).numpy()

    tables = {"text_projected": ((text_vocab, hidden), np.float32, projected())}
    for name in ("codec_embedding", "cp_heads", "cp_codec_embedding", *extra):
        tables[name] = (source.sources[name].out, np.float32, whole(name))
    write_safetensors(path, tables)


def project(mlp: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    fc1 = torch.nn.functional.linear(rows, mlp["fc1.weight"], mlp["fc1.bias"])
    return torch.nn.functional.linear(torch.nn.functional.silu(fc1), mlp["fc2.weight"], mlp["fc2.bias"])


def _export_tokenizer(checkpoint: Path, path: Path) -> None:
    """Save the tokenizer exactly as the reference processor loads it (incl. its regex patching)."""
    from engines.qwen3_tts.reference import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSProcessor

    processor = Qwen3TTSProcessor.from_pretrained(str(checkpoint), fix_mistral_regex=True)
    processor.tokenizer.backend_tokenizer.save(str(path))


def graph_specs(files: dict[str, str], tensors: dict) -> dict[str, Graph]:
    """The manifest's graphs from what each graph's export returned (tensor lists, carried state)."""
    return {role: Graph(files[role], tuple(g["inputs"]), tuple(g["outputs"]),
                        tuple(StateSpec(s["input"], s["output"], tuple(s["shape"])) for s in g.get("state", ())))
            for role, g in tensors.items()}


def _manifest(cfg: Qwen3TTSConfig, tensors: dict, max_batch: int, max_seq: int) -> Manifest:
    t = cfg.talker
    graphs = graph_specs(FILES, tensors)
    return Manifest(
        family="qwen3_tts", model_type=cfg.model_type, supports_instruct=cfg.instruct, precision="fp32",
        dims=Dims(hidden=t.hidden, layers=t.layers, kv_heads=t.kv_heads, head_dim=t.head_dim, vocab=cfg.vocab,
                  text_vocab=cfg.text_vocab, text_hidden=cfg.text_hidden, code_groups=cfg.code_groups,
                  codebook_size=cfg.codebook_size),
        max_batch=max_batch, max_seq=max_seq, special=dict(cfg.special),
        speakers={name: Speaker(s["id"], s["dialect"]) for name, s in cfg.speakers.items()},
        languages=dict(cfg.languages), sample_rate=cfg.codec.output_sample_rate,
        samples_per_frame=cfg.codec.decode_upsample_rate, sampling=dict(cfg.sampling),
        graphs=graphs, files={"embeddings": FILES["embeddings"], "tokenizer": FILES["tokenizer"]},
    )
