"""The export memo (engines/export_memo.py): with EDGED_EXPORT_MEMO set, a vocoder whose codec was
exported before is copied, not traced again; a codec that differs in one weight is traced; without
the variable every export traces and nothing is kept. The copy still passes export_codec's own check (ORT against this
codec in torch), so a key that missed a weight would fail there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engines.export_memo import ENV
from engines.qwen3_tts.codec import load_codec
from engines.qwen3_tts.codec_export import export_codec


@pytest.fixture
def traces(monkeypatch) -> list[str]:
    """torch.onnx.export's calls from here on, by the traced module's class."""
    calls: list[str] = []
    export = torch.onnx.export

    def counted(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return export(module, *args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", counted)
    return calls


def test_a_codec_exported_before_is_copied_one_weight_apart_traced_and_nothing_kept_when_off(
        checkpoints, traces, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "memo"))
    _, codec = load_codec(checkpoints(0))
    first = export_codec(codec, tmp_path / "first.onnx")
    assert traces == ["StreamingCodec"]
    again = export_codec(codec, tmp_path / "again.onnx")
    assert traces == ["StreamingCodec"], "the same codec was traced again"
    assert again == first and (tmp_path / "again.onnx").read_bytes() == (tmp_path / "first.onnx").read_bytes()

    weight = next(p for name, p in codec.named_parameters() if name.endswith("weight"))
    with torch.no_grad():
        weight.mul_(1.5)
    export_codec(codec, tmp_path / "changed.onnx")  # checked against the changed codec by ORT
    assert traces == ["StreamingCodec"] * 2
    assert (tmp_path / "changed.onnx").read_bytes() != (tmp_path / "first.onnx").read_bytes()

    monkeypatch.delenv(ENV)
    export_codec(codec, tmp_path / "off.onnx")
    assert traces == ["StreamingCodec"] * 3, "an export without the variable took the kept graph"
    assert (tmp_path / "off.onnx").read_bytes() == (tmp_path / "changed.onnx").read_bytes()
    assert sorted(p.suffix for p in (tmp_path / "memo").iterdir()) == [".onnx", ".onnx"]
