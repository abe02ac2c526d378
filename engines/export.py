"""Checkpoint -> engine artifact: ONNX graphs, host-side tables, tokenizer, `artifact.json`.

The graph contracts are documented in docs/artifact.md; `edged.artifact` validates what this
writes. Graphs use the default (dynamo) exporter at opset 18: the legacy exporter cannot export
the vocoder, and newer opsets fuse attention into ops TensorRT may not accept. Dynamic dims are
exported from example sizes >= 2 (size 1 would specialise them) and checked afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch
from safetensors.torch import save_file

from engines.qwen3_tts import (
    CodePredictorFrame,
    Qwen3TTSConfig,
    Talker,
    TalkerDecode,
    TalkerPrefill,
    load_qwen3_tts,
)

OPSET = 18
FORMAT = 1
FILES = {
    "talker_prefill": "talker_prefill.onnx",
    "talker_decode": "talker_decode.onnx",
    "code_predictor": "code_predictor.onnx",
    "vocoder": "vocoder.onnx",
    "embeddings": "embeddings.safetensors",
    "tokenizer": "tokenizer.json",
}
SAMPLING_INPUTS = ["temperature", "top_k", "top_p", "noise"]
CODE0_INPUTS = ["seen", "repetition_penalty", "allow_eos"]


def export(checkpoint: Path, out: Path, *, max_batch: int = 4, max_seq: int = 1024) -> dict:
    """Write the artifact for `checkpoint` into `out` and return its manifest."""
    from engines.qwen3_tts_codec import export_vocoder

    checkpoint, out = Path(checkpoint), Path(out)
    if max_batch < 1 or max_seq < 16:
        raise ValueError(f"max_batch must be >= 1 and max_seq >= 16 (got {max_batch}, {max_seq})")
    cfg, talker, predictor, tables = load_qwen3_tts(checkpoint)
    codec = json.loads((checkpoint / "speech_tokenizer" / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        tensors = {
            "talker_prefill": _export_prefill(talker, out / FILES["talker_prefill"]),
            "talker_decode": _export_decode(talker, out / FILES["talker_decode"], max_seq),
            "code_predictor": _export_predictor(predictor, out / FILES["code_predictor"]),
        }
        tensors["vocoder"] = export_vocoder(checkpoint, out / FILES["vocoder"])  # stateful: lists its state
        save_file(_host_tables(cfg, tables), str(out / FILES["embeddings"]))
    _export_tokenizer(checkpoint, out / FILES["tokenizer"])
    manifest = _manifest(cfg, codec, tensors, max_batch, max_seq)
    (out / "artifact.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ----------------------------------------------------------------------------------------- graphs


def _kv_names(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]


def _sampling_examples(batch: int, vocab: int, code0: bool) -> tuple:
    torch.manual_seed(0)
    head = (torch.zeros(batch, vocab), torch.ones(batch), torch.ones(batch, dtype=torch.bool)) if code0 else ()
    return head + (
        torch.full((batch,), 0.9), torch.full((batch,), 50, dtype=torch.long),
        torch.ones(batch), torch.rand(batch, vocab),
    )


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: tuple) -> dict:
    program = torch.onnx.export(
        module.eval(), args, dynamo=True, opset_version=OPSET, input_names=inputs, output_names=outputs,
        dynamic_shapes=dynamic, optimize=True, verbose=False,
    )
    program.save(str(path))
    model = onnx.load(str(path), load_external_data=False)
    got = [i.name for i in model.graph.input]
    if got != inputs:
        raise RuntimeError(f"{path.name}: exported inputs {got}, expected {inputs}")
    _check_dynamic(model, path.name, dynamic, inputs)
    _inline_external_data(path)
    return {"inputs": inputs, "outputs": outputs}


def _check_dynamic(model: onnx.ModelProto, name: str, dynamic: tuple, inputs: list[str]) -> None:
    """The exporter silently specialises a dim it could not keep dynamic: check every input."""
    flat = _flatten(dynamic)
    for spec, value in zip(flat, model.graph.input):
        for axis in (spec or {}):
            dim = value.type.tensor_type.shape.dim[axis]
            if dim.HasField("dim_value"):
                raise RuntimeError(f"{name}: input {value.name} axis {axis} was exported static ({dim.dim_value})")


def _flatten(dynamic: tuple) -> list:
    flat = []
    for item in dynamic:
        if isinstance(item, (tuple, list)):
            flat.extend(item)
        else:
            flat.append(item)
    return flat


def _inline_external_data(path: Path) -> None:
    """Keep each graph one self-contained file (tiny and small models fit under protobuf's 2 GiB)."""
    data = path.with_name(path.name + ".data")
    if not data.exists():
        return
    model = onnx.load(str(path), load_external_data=True)
    if model.ByteSize() < 1_900_000_000:
        onnx.save_model(model, str(path), save_as_external_data=False)
        data.unlink()


def _export_prefill(talker: Talker, path: Path) -> dict:
    cfg = talker.cfg
    x = torch.randn(1, 5, cfg.talker.hidden)
    args = (x, *_sampling_examples(1, cfg.vocab, code0=True))
    inputs = ["inputs_embeds", *CODE0_INPUTS, *SAMPLING_INPUTS]
    outputs = ["hidden", "code0", *_kv_names("new", cfg.talker.layers)]
    seq = torch.export.Dim("T", min=1, max=32768)
    dynamic = ({1: seq},) + (None,) * 7
    return _export(TalkerPrefill(talker), args, path, inputs, outputs, dynamic)


def _export_decode(talker: Talker, path: Path, max_seq: int) -> dict:
    c = talker.cfg.talker
    b = 2
    cache = []
    for _ in range(c.layers):
        cache += [torch.zeros(b, c.kv_heads, c.head_dim, max_seq), torch.zeros(b, c.kv_heads, max_seq, c.head_dim)]
    args = (torch.randn(b, c.hidden), torch.tensor([3, 7]), *_sampling_examples(b, talker.cfg.vocab, code0=True), *cache)
    inputs = ["inputs_embeds", "positions", *CODE0_INPUTS, *SAMPLING_INPUTS, *_kv_names("past", c.layers)]
    outputs = ["hidden", "code0", *_kv_names("new", c.layers)]
    batch = torch.export.Dim("B", min=1, max=1024)
    dynamic = ({0: batch},) * 9 + (tuple({0: batch} for _ in cache),)
    return _export(TalkerDecode(talker), args, path, inputs, outputs, dynamic)


def _export_predictor(predictor: CodePredictorFrame, path: Path) -> dict:
    cfg = predictor.cfg
    b = 2
    args = (
        torch.randn(b, cfg.talker.hidden), torch.tensor([5, 9]),
        torch.full((b,), 0.9), torch.full((b,), 50, dtype=torch.long), torch.ones(b),
        torch.rand(b, cfg.code_groups - 1, cfg.codebook_size),
    )
    inputs = ["hidden", "code0", *SAMPLING_INPUTS]
    batch = torch.export.Dim("B", min=1, max=1024)
    dynamic = ({0: batch},) * 6
    return _export(predictor, args, path, inputs, ["codes", "codec_sum"], dynamic)


# ----------------------------------------------------------------------------------------- host side


def _host_tables(cfg: Qwen3TTSConfig, tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The projected text table P(x) = text_projection(text_embedding(x)) for every text token, the
    codec embedding, and the projected tts_bos/eos/pad rows.

    The projection acts on each token alone, so precomputing it (in torch, as the reference computes
    it) turns a per-request MLP into a row lookup, and the table is smaller than the embedding it
    replaces (hidden <= text_hidden)."""
    emb = tables["text_embedding"]
    projected = torch.empty(emb.shape[0], cfg.talker.hidden)
    for start in range(0, emb.shape[0], 8192):
        projected[start:start + 8192] = _project(tables, emb[start:start + 8192])
    sp = cfg.special
    return {
        "text_projected": projected,
        "codec_embedding": tables["codec_embedding"].contiguous(),
        "tts_bos": projected[sp["tts_bos"]].clone(),
        "tts_eos": projected[sp["tts_eos"]].clone(),
        "tts_pad": projected[sp["tts_pad"]].clone(),
    }


def _project(tables: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    fc1 = torch.nn.functional.linear(rows, tables["text_projection.fc1.weight"], tables["text_projection.fc1.bias"])
    return torch.nn.functional.linear(
        torch.nn.functional.silu(fc1), tables["text_projection.fc2.weight"], tables["text_projection.fc2.bias"])


def _export_tokenizer(checkpoint: Path, path: Path) -> None:
    """Save the tokenizer exactly as the reference processor loads it (incl. its regex patching)."""
    from engines.reference import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSProcessor

    processor = Qwen3TTSProcessor.from_pretrained(str(checkpoint), fix_mistral_regex=True)
    processor.tokenizer.backend_tokenizer.save(str(path))


def _manifest(cfg: Qwen3TTSConfig, codec: dict, tensors: dict, max_batch: int, max_seq: int) -> dict:
    t = cfg.talker
    spf = int(codec.get("decode_upsample_rate", 1920))
    rate = int(codec.get("output_sample_rate", 24000))
    return {
        "format": FORMAT,
        "family": "qwen3_tts",
        "model": {"type": cfg.model_type, "instruct": cfg.instruct},
        "files": FILES,
        "dims": {
            "hidden": t.hidden, "layers": t.layers, "kv_heads": t.kv_heads, "head_dim": t.head_dim,
            "vocab": cfg.vocab, "text_vocab": cfg.text_vocab, "text_hidden": cfg.text_hidden,
            "code_groups": cfg.code_groups, "codebook_size": cfg.codebook_size,
        },
        "limits": {"max_batch": max_batch, "max_seq": max_seq},
        "special": cfg.special,
        "speakers": cfg.speakers,
        "languages": cfg.languages,
        "audio": {"sample_rate": rate, "frame_rate": rate / spf, "samples_per_frame": spf},
        "sampling": cfg.sampling,
        "tensors": tensors,
    }


__all__ = ["export", "FILES", "FORMAT"]
