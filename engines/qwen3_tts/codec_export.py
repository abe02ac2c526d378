"""The streaming vocoder graph (docs/artifact.md) from the codec model, and its check on ONNX Runtime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from engines import export_memo
from engines.onnx import save_program
from engines.qwen3_tts.codec import Codec, CodecConfig, StreamingCodec, load_codec

# ------------------------------------------------------------------------------------ ONNX export

CODES, START, PCM = "codes", "start", "pcm"  # [B, G, F] int64, [B] int64, [B, F * samples_per_frame] float32
EXPORT_CHECK_TOLERANCE = 1e-3  # ORT vs torch on the exported weights; measured errors are ~1e-7
CHECK_WINDOWS = (3, 1, 4)  # frames per call of the post-export check, the first call from fresh state


def state_names(count: int) -> tuple[list[str], list[str]]:
    """Graph names of the state inputs and outputs: state_in_i / state_out_i."""
    return [f"state_in_{i}" for i in range(count)], [f"state_out_{i}" for i in range(count)]


def export_vocoder(checkpoint_dir: str | Path, out_path: str | Path, opset: int = 18) -> dict:
    """Writes the streaming `vocoder` graph of docs/artifact.md for a checkpoint and returns its
    manifest entry (see `export_codec`)."""
    _, codec = load_codec(checkpoint_dir)
    return export_codec(codec, out_path, opset)


def export_codec(codec: Codec, out_path: str | Path, opset: int = 18) -> dict:
    """Exports `StreamingCodec(codec)` as one self-contained ONNX file, checks its dims (B and F
    dynamic, state dims static) and runs it on ONNX Runtime, streaming two random utterances in
    windows of CHECK_WINDOWS frames, against the torch whole decode. Raises if they differ by more
    than EXPORT_CHECK_TOLERANCE. Returns the manifest entry:

      {"inputs": ["codes", "start", "state_in_0", ...], "outputs": ["pcm", "state_out_0", ...],
       "state": [{"input": "state_in_0", "output": "state_out_0", "shape": [...]}, ...]}

    with each state shape given without its leading batch axis.
    """
    config = codec.config
    specs = codec.state_specs()
    state_in, state_out = state_names(len(specs))
    manifest = {
        "inputs": [CODES, START, *state_in],
        "outputs": [PCM, *state_out],
        "state": [
            {"input": i, "output": o, "shape": list(shape)} for i, o, (_, shape) in zip(state_in, state_out, specs)
        ],
    }
    # torch.export specialises a dim whose example size is 1, and an example size equal to a static
    # dim can be unified with it, so B and F get example sizes >= 2 that no other dim has.
    batch, frames = _example_sizes({config.num_quantizers, *(d for _, shape in specs for d in shape)})
    example = (
        torch.zeros(batch, config.num_quantizers, frames, dtype=torch.int64),
        torch.zeros(batch, dtype=torch.int64),
        *codec.fresh_state(batch),
    )
    batch_dim, frames_dim = torch.export.Dim("batch"), torch.export.Dim("frames")
    # The varargs `*state` of StreamingCodec.forward take their dims as one nested tuple.
    dynamic = ({0: batch_dim, 2: frames_dim}, {0: batch_dim}, tuple({0: batch_dim} for _ in specs))
    streaming = StreamingCodec(codec).eval()

    def trace(out: Path) -> None:
        with torch.no_grad():
            program = torch.onnx.export(
                streaming,
                example,
                dynamo=True,
                opset_version=opset,
                input_names=manifest["inputs"],
                output_names=manifest["outputs"],
                dynamic_shapes=dynamic,
            )
        save_program(program, out, external_data=False)

    shapes = [tuple(t.shape) for t in example]
    export_memo.exported(export_memo.key(streaming, config, specs, shapes, opset, manifest), Path(out_path), trace)
    _check_dims(onnx.load(str(out_path), load_external_data=False), config, specs)
    error = verify_onnx(codec, out_path, batch=2, windows=CHECK_WINDOWS)
    if error > EXPORT_CHECK_TOLERANCE:
        raise RuntimeError(f"{out_path}: ONNX Runtime differs from torch by {error:.3g}")
    return manifest


def _example_sizes(taken: set[int]) -> tuple[int, int]:
    """(batch, frames) example sizes: distinct, >= 2, and not in `taken`."""
    free = (n for n in range(2, 2 + len(taken) + 2) if n not in taken)
    return next(free), next(free)


def _check_dims(model: onnx.ModelProto, config: CodecConfig, specs: Sequence[tuple[str, tuple[int, ...]]]) -> None:
    """codes [B, G, F], start [B], pcm [B, P], every state [B, *static shape], with B, F (and P)
    dynamic, B one symbol throughout and F another."""

    def dims(value: onnx.ValueInfoProto) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    shapes = {v.name: dims(v) for v in (*model.graph.input, *model.graph.output)}
    state_in, state_out = state_names(len(specs))
    codes = shapes[CODES]
    batch, frames = (codes[0], codes[2]) if len(codes) == 3 else (None, None)
    expected = {CODES: [batch, config.num_quantizers, frames], START: [batch]}
    for i, o, (_, shape) in zip(state_in, state_out, specs):
        expected[i] = expected[o] = [batch, *shape]
    pcm = shapes[PCM]
    problems = [f"{name} is {shapes.get(name)}, expected {want}" for name, want in expected.items()
                if shapes.get(name) != want]
    if not (isinstance(batch, str) and isinstance(frames, str) and batch != frames):
        problems.append(f"codes is {codes}: B and F must be distinct dynamic dims")
    if len(pcm) != 2 or pcm[0] != batch or not isinstance(pcm[1], str):
        problems.append(f"pcm is {pcm}, expected [{batch}, dynamic]")
    if problems:
        raise RuntimeError("exported vocoder shapes: " + "; ".join(problems))


def verify_onnx(codec: Codec, onnx_path: str | Path, batch: int, windows: Sequence[int], seed: int = 0) -> float:
    """Max |ORT - torch| between streaming random codes [batch, G, sum(windows)] through the graph
    (window by window from fresh state, state_out fed back as state_in) and the torch whole decode."""
    config = codec.config
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, config.codebook_size, (batch, config.num_quantizers, sum(windows)), generator=generator)
    with torch.no_grad():
        expected = codec(codes).numpy()  # [B, P]
    state_in, state_out = state_names(len(codec.state_slots))
    state = [s.numpy() for s in codec.fresh_state(batch)]
    start, chunks = 0, []
    for frames in windows:
        feeds = {CODES: codes[..., start : start + frames].numpy(), START: np.full(batch, start, dtype=np.int64)}
        pcm, *state = session.run([PCM, *state_out], {**feeds, **dict(zip(state_in, state))})
        if pcm.shape != (batch, frames * config.samples_per_frame):
            raise RuntimeError(f"ONNX pcm {pcm.shape} for codes {feeds[CODES].shape}")
        chunks.append(pcm)
        start += frames
    return float(np.abs(np.concatenate(chunks, axis=1) - expected).max())
