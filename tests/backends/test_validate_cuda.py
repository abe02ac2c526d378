"""scripts/validate_cuda.py's rows (the TensorRT backend's CUDA side on a GPU) through the doubles of
pycuda and the CUDA driver: each row passes, and a row fails when what it checks breaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import fake_trt

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def validate(monkeypatch):
    fake_trt.install(monkeypatch)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import summary
    import validate_cuda

    yield validate_cuda, summary.Summary()
    assert fake_trt.stack_depth() == 0, "a CUDA context was left pushed: pycuda aborts at exit"


def test_every_row_passes_through_the_doubles(validate):
    validate_cuda, summary = validate
    validate_cuda.checks(summary, rounds=3)
    rows = {check: (verdict, detail) for check, verdict, detail in summary.rows}
    assert list(rows) == ["device", "kernels", "K/V append", "copies", "fresh memory", "CUDA graph",
                          "failed capture", "Graph after a failed capture"]
    assert all(verdict == "PASS" for verdict, _ in rows.values()), rows
    assert rows["kernels"][1].startswith("built for sm_87 by nvcc")
    assert "equal [True, True, True]" in rows["CUDA graph"][1]
    assert "LogicError: cuMemsetD8 failed: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" in rows["failed capture"][1]
    assert "cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" in rows["failed capture"][1]
    assert "(libcudart.so.12's last error cleared)" in rows["Graph after a failed capture"][1]


def test_the_rows_hold_without_a_libcudart_to_load(validate, monkeypatch):
    """A machine whose CUDA is not 12 has no libcudart.so.12: the failed capture's cleanup logs that and
    goes on, and the row says so."""
    from edged.backends import cuda_graph

    def missing():
        raise OSError("libcudart.so.12: cannot open shared object file: No such file or directory")
    monkeypatch.setattr(cuda_graph, "runtime", missing)
    validate_cuda, summary = validate
    validate_cuda.checks(summary, rounds=1)
    rows = {check: (verdict, detail) for check, verdict, detail in summary.rows}
    assert all(verdict == "PASS" for verdict, _ in rows.values()), rows
    assert "(no libcudart.so.12 here: logged, and the cleanup went on)" in rows["Graph after a failed capture"][1]


def test_a_device_empty_that_does_not_zero_fails_its_row(validate, monkeypatch):
    """Fresh device memory holds what was there: a device_empty without its memset (here, every
    synchronous memset a no-op) fails "fresh memory"."""
    import sys

    validate_cuda, summary = validate
    monkeypatch.setattr(sys.modules["pycuda.driver"], "memset_d8", lambda *args: None)
    validate_cuda.checks(summary, rounds=1)
    verdicts = {check: verdict for check, verdict, _ in summary.rows}
    assert verdicts["fresh memory"] == "FAIL" and verdicts["copies"] == "PASS"


def test_an_append_that_ignores_the_active_mask_fails_its_rows(validate, monkeypatch):
    """The kernel as if it appended for every member: the append and graph rows fail."""
    validate_cuda, summary = validate
    from edged.backends import kernels

    monkeypatch.setattr(kernels, "SOURCE", kernels.SOURCE.replace("if (active && !active[m]) return;", ""))
    monkeypatch.setattr(kernels, "SOURCE_SHA256", "x")
    validate_cuda.checks(summary, rounds=1)
    verdicts = {check: verdict for check, verdict, _ in summary.rows}
    assert verdicts["K/V append"] == "FAIL" and verdicts["CUDA graph"] == "FAIL" and verdicts["copies"] == "PASS"
