"""The export memo (engines/export_memo.py): with EDGED_EXPORT_MEMO set, a vocoder whose codec was
exported before is copied, not traced again, and a codec one weight apart is traced; without the
variable the export runs whatever is kept. The copy still passes export_codec's own check (ORT
against this codec in torch), so a key that missed a weight fails there."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engines.export_memo import ENV, exported
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


def test_a_codec_exported_before_is_copied_and_one_weight_apart_is_traced(checkpoints, traces, tmp_path, monkeypatch):
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
    kept = sorted((tmp_path / "memo").iterdir())
    assert [p.suffix for p in kept] == [".onnx", ".onnx"]

    monkeypatch.delenv(ENV)  # off: the export runs although a graph is kept under its key
    made: list[Path] = []
    exported(kept[0].stem, tmp_path / "off.onnx", made.append)
    assert made == [tmp_path / "off.onnx"] and not (tmp_path / "off.onnx").exists()
    assert sorted((tmp_path / "memo").iterdir()) == kept
