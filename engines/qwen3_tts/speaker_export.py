"""The speaker encoder (log-mel front end + ECAPA-TDNN) as one ONNX graph: 24 kHz PCM in, x-vector out.

Voice cloning takes the reference audio's x-vector from qwen-tts's `extract_speaker_embedding`:
`mel_spectrogram(pcm, n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256, win_size=1024,
fmin=0, fmax=12000)`, transposed, through `speaker_encoder`, first row. The graph does the same:

    pcm     float32 [1, N]         24 kHz mono samples, N >= SpeakerGraph.min_samples (1 s is plenty)
    xvector float32 [1, enc_dim]

The mel front end, as `mel_spectrogram` computes it, without the ONNX STFT op or complex numbers
(TensorRT builds neither):

- reflect padding of (n_fft - hop) // 2 = 384 samples on both sides, then an uncentred STFT
  (center=False), so T = floor(N / 256) frames; written as Slice + flip + Concat;
- the periodic-Hann-windowed DFT as one strided Conv (real and imaginary bases in one weight,
  computed in float64), magnitude sqrt(re^2 + im^2 + 1e-9);
- librosa's Slaney mel basis (the library's own call), log(clamp(mel, 1e-5)).

`SpeakerGraph` runs the library's ECAPA-TDNN weights with its forward written out, because the
library's forward exports badly for a dynamic length: each reflect-padded Conv1d becomes an unfolded
chain of pad-shape ops, the pooling's all-ones mask becomes Range/Equal/Where, and the final
`squeeze(-1)` an If. The math is the same: the pooling mask is all ones for one utterance, so its
first statistics are the plain mean and std over time and the masked_fill is a no-op. This ECAPA
has no BatchNorm (TDNN blocks are Conv1d + ReLU).

Exported with the TorchScript exporter (dynamo=False) at opset 17, fp32.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from engines.qwen3_tts.speech_encoder_export import probe_signal

PCM, XVECTOR = "pcm", "xvector"
OPSET = 17
SAMPLE_RATE = 24000
# extract_speaker_embedding's mel settings
N_FFT, HOP, WIN, NUM_MELS, FMIN, FMAX = 1024, 256, 1024, 128, 0, 12000
MAGNITUDE_EPS = 1e-9  # added to re^2 + im^2 before the sqrt, as the library
LOG_CLAMP = 1e-5  # dynamic_range_compression_torch's clip_val
EXPORT_CHECK_SECONDS = (1.0, 2.7)  # post-export check lengths; the second is not a whole number of hops
EXPORT_CHECK_TOLERANCE = 1e-4  # max |ORT - library| / max |library|; measured ~1e-6 on tiny encoders


def export_speaker_encoder(encoder: torch.nn.Module, out: Path, sample_rate: int = 24000) -> None:
    """Write the speaker graph of `encoder` (qwen-tts's `Qwen3TTSSpeakerEncoder`, a Base checkpoint's
    `model.speaker_encoder`) to `out` as one self-contained fp32 ONNX file.

    Afterwards checks the graph's dims, that it has no STFT node, and runs it on ONNX Runtime for
    EXPORT_CHECK_SECONDS of a test signal against the library's own path; raises if the x-vectors
    differ by more than EXPORT_CHECK_TOLERANCE of their scale.
    """
    if sample_rate != SAMPLE_RATE:  # extract_speaker_embedding asserts it too
        raise ValueError(f"qwen-tts's speaker encoder takes {SAMPLE_RATE} Hz audio, got sample_rate={sample_rate}")
    graph = SpeakerGraph(encoder).eval()
    example = torch.from_numpy(probe_signal(int(1.3 * sample_rate)))[None]  # [1, N], N not a hop multiple
    with torch.no_grad():
        torch.onnx.export(
            graph, (example,), str(out), dynamo=False, opset_version=OPSET, do_constant_folding=True,
            input_names=[PCM], output_names=[XVECTOR], dynamic_axes={PCM: {1: "samples"}},
        )
    _check_graph(onnx.load(str(out)), graph.enc_dim)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for seconds in EXPORT_CHECK_SECONDS:
        pcm = probe_signal(int(seconds * sample_rate))
        (got,) = session.run([XVECTOR], {PCM: pcm[None]})
        want = library_xvector(encoder, pcm)
        error = float(np.abs(got[0] - want).max() / np.abs(want).max())
        if got.shape != (1, graph.enc_dim) or error > EXPORT_CHECK_TOLERANCE:
            raise RuntimeError(f"{out}: ONNX x-vector {got.shape} differs from the library's by {error:.3g} "
                               f"(relative) for {pcm.size} samples")


def library_xvector(encoder: torch.nn.Module, pcm: np.ndarray) -> np.ndarray:
    """qwen-tts's own path, as `extract_speaker_embedding` calls it: float32 [enc_dim]."""
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    mels = mel_spectrogram(
        torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).unsqueeze(0), n_fft=N_FFT,
        num_mels=NUM_MELS, sampling_rate=SAMPLE_RATE, hop_size=HOP, win_size=WIN, fmin=FMIN, fmax=FMAX,
    ).transpose(1, 2)
    with torch.inference_mode():
        return encoder(mels)[0].float().numpy()


def _check_graph(model: onnx.ModelProto, enc_dim: int) -> None:
    """pcm [1, samples] float32 in, xvector [1, enc_dim] float32 out; no STFT/DFT or control flow."""

    def signature(value: onnx.ValueInfoProto) -> tuple[list[str | int], int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim], value.type.tensor_type.elem_type

    shapes = {v.name: signature(v) for v in (*model.graph.input, *model.graph.output)}
    expected = {PCM: ([1, "samples"], onnx.TensorProto.FLOAT), XVECTOR: ([1, enc_dim], onnx.TensorProto.FLOAT)}
    problems = [f"{name} is {shapes.get(name)}, expected {want}" for name, want in expected.items()
                if shapes.get(name) != want]
    banned = {"STFT", "DFT", "If", "Loop", "Scan"} & {node.op_type for node in model.graph.node}
    if banned:
        problems.append(f"graph has {sorted(banned)} nodes")
    if problems:
        raise RuntimeError("exported speaker encoder: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ graph


class SpeakerGraph(nn.Module):
    """pcm [1, N] -> xvector [1, enc_dim]: `mel_spectrogram` + `Qwen3TTSSpeakerEncoder`, traceable for any N.

    Holds the library's encoder (its convs are applied with their own weights); the STFT, the convs'
    reflect padding and the attentive pooling are written out here.
    """

    dft: torch.Tensor  # [2 * bins, 1, n_fft]: windowed cos rows, then windowed -sin rows
    mel_basis: torch.Tensor  # [mels, bins]

    def __init__(self, encoder: Any):
        super().__init__()
        from librosa.filters import mel as librosa_mel_fn  # the library's own mel basis

        self.encoder = encoder
        self.enc_dim = int(encoder.fc.out_channels)
        if encoder.blocks[0].conv.in_channels != NUM_MELS:
            raise ValueError(f"speaker encoder takes {encoder.blocks[0].conv.in_channels} mels, the front end makes {NUM_MELS}")
        self.register_buffer("dft", _dft_basis(N_FFT, WIN).float(), persistent=False)
        mel = librosa_mel_fn(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=NUM_MELS, fmin=FMIN, fmax=FMAX)
        self.register_buffer("mel_basis", torch.from_numpy(mel).float(), persistent=False)
        # _conv_pads raises for a conv this graph does not reproduce. Reflect padding needs more
        # frames than its pad, and there are T = floor(N / hop) frames.
        widest = max(max(_conv_pads(m)) for m in encoder.modules() if isinstance(m, nn.Conv1d))
        self.min_samples = max(HOP * (widest + 1), (N_FFT - HOP) // 2 + 1, N_FFT - 2 * ((N_FFT - HOP) // 2))

    def forward(self, pcm: torch.Tensor) -> torch.Tensor:
        mels = self.log_mel(pcm)  # [1, mels, T]
        return self.ecapa(mels)  # [1, enc_dim]

    def log_mel(self, pcm: torch.Tensor) -> torch.Tensor:
        """`mel_spectrogram` without its transpose: [1, N] -> [1, mels, floor(N / hop)]."""
        pad = (N_FFT - HOP) // 2
        x = _reflect_pad(pcm[:, None, :], pad, pad)  # [1, 1, N + 2 * pad]
        spec = nn.functional.conv1d(x, self.dft, stride=HOP)  # [1, 2 * bins, T]
        bins = self.mel_basis.shape[1]
        re, im = spec[:, :bins], spec[:, bins:]
        magnitude = torch.sqrt(re.pow(2) + im.pow(2) + MAGNITUDE_EPS)
        mel = torch.matmul(self.mel_basis, magnitude)  # [1, mels, T]
        return torch.log(torch.clamp(mel, min=LOG_CLAMP))

    def ecapa(self, x: torch.Tensor) -> torch.Tensor:
        """Qwen3TTSSpeakerEncoder.forward on [1, mels, T] (already channels-first) -> [1, enc_dim]."""
        enc = self.encoder
        outputs = []
        for i, block in enumerate(enc.blocks):
            x = _tdnn(block, x) if i == 0 else _se_res2net(block, x)
            outputs.append(x)
        x = _tdnn(enc.mfa, torch.cat(outputs[1:], dim=1))  # multi-layer feature aggregation
        pooled = _attentive_pooling(enc.asp, x)  # [1, 2C, 1]
        return _conv(enc.fc, pooled)[..., 0]  # [1, enc_dim]; indexing, not squeeze (an If in ONNX)


def _dft_basis(n_fft: int, win: int) -> torch.Tensor:
    """[2 * (n_fft // 2 + 1), 1, n_fft] float64: periodic Hann (torch.hann_window) times cos, then
    times -sin, so conv1d(frames) gives torch.stft's real and imaginary parts (onesided)."""
    if win != n_fft:
        raise ValueError("a window shorter than n_fft is not supported")
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)
    window = torch.hann_window(win, periodic=True, dtype=torch.float64)
    # (k * n) mod n_fft keeps the angles small and exact before the float64 trig
    angle = 2 * math.pi * torch.remainder(k[:, None] * n[None, :], n_fft) / n_fft  # [bins, n_fft]
    basis = torch.cat([window * torch.cos(angle), -window * torch.sin(angle)], dim=0)
    return basis[:, None, :]


def _reflect_pad(x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """F.pad(x, (left, right), mode="reflect") on the last axis as Slice + flip + Concat: the exporter
    turns F.pad into an unfolded chain of pad-shape ops. Needs x.shape[-1] > max(left, right)."""
    parts = [x]
    if left:
        parts.insert(0, x[..., 1 : left + 1].flip(-1))
    if right:
        parts.append(x[..., -right - 1 : -1].flip(-1))
    return torch.cat(parts, dim=-1) if len(parts) > 1 else x


def _conv_pads(conv: nn.Conv1d) -> tuple[int, int]:
    """(left, right) reflect pad of one of the library's Conv1d (padding="same", padding_mode="reflect")."""
    if conv.padding != "same" or conv.padding_mode != "reflect" or conv.stride != (1,) or conv.groups != 1:
        raise ValueError(f"unsupported speaker-encoder conv {conv}")
    total = conv.dilation[0] * (conv.kernel_size[0] - 1)  # torch's "same": the odd sample goes right
    return total // 2, total - total // 2


def _conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """The library's Conv1d: reflect pad (static amounts), then an unpadded conv with its weights."""
    x = _reflect_pad(x, *_conv_pads(conv))
    return nn.functional.conv1d(x, conv.weight, conv.bias, stride=1, padding=0, dilation=conv.dilation)


def _tdnn(block: Any, x: torch.Tensor) -> torch.Tensor:
    """TimeDelayNetBlock: conv, ReLU."""
    return torch.relu(_conv(block.conv, x))


def _se_res2net(block: Any, x: torch.Tensor) -> torch.Tensor:
    """SqueezeExcitationRes2NetBlock: tdnn1, Res2Net, tdnn2, squeeze-excitation, residual."""
    h = _tdnn(block.tdnn1, x)
    h = _res2net(block.res2net_block, h)
    h = _tdnn(block.tdnn2, h)
    se = block.se_block
    s = h.mean(dim=2, keepdim=True)  # [1, C, 1]
    s = torch.sigmoid(_conv(se.conv2, torch.relu(_conv(se.conv1, s))))
    return h * s + x


def _res2net(block: Any, x: torch.Tensor) -> torch.Tensor:
    """Res2NetBlock: `scale` channel groups (static slices for torch.chunk), the first passed through,
    each later one through its TDNN after adding the previous group's output."""
    scale = block.scale
    width = block.blocks[0].conv.in_channels  # in_channels // scale; chunk sizes are equal when it divides
    if block.blocks[0].conv.out_channels != width:
        raise ValueError(f"Res2Net groups of {width} in, {block.blocks[0].conv.out_channels} out are not supported")
    outputs = [x[:, :width]]
    for i in range(1, scale):
        part = x[:, i * width : (i + 1) * width]
        outputs.append(_tdnn(block.blocks[i - 1], part if i == 1 else part + outputs[-1]))
    return torch.cat(outputs, dim=1)


def _attentive_pooling(asp: Any, x: torch.Tensor) -> torch.Tensor:
    """AttentiveStatisticsPooling for one unpadded utterance: [1, C, T] -> [1, 2C, 1]. Its mask is all
    ones, so the global context is the plain mean and std over time and masked_fill changes nothing."""
    mean, std = _statistics(x, torch.full_like(x[:, :1], 1.0) / x.shape[-1], asp.eps)
    context = torch.cat([x, mean.expand_as(x), std.expand_as(x)], dim=1)  # [1, 3C, T]
    attention = _conv(asp.conv, torch.tanh(_tdnn(asp.tdnn, context)))  # [1, C, T]
    mean, std = _statistics(x, torch.softmax(attention, dim=2), asp.eps)
    return torch.cat([mean, std], dim=1)


def _statistics(x: torch.Tensor, weights: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """AttentiveStatisticsPooling._compute_statistics over time, keeping the axis: [1, C, 1] each."""
    mean = (weights * x).sum(dim=2, keepdim=True)
    std = torch.sqrt((weights * (x - mean).pow(2)).sum(dim=2, keepdim=True).clamp(eps))
    return mean, std
