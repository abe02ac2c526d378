"""Reading a sharded checkpoint is lazy, measured: a few rows of a tensor cost a few rows, not the
tensor, and reading every tensor one after another peaks at about one tensor, not the checkpoint
(engines/weights.py `Checkpoint.read`). Measured as the peak resident memory of a fresh interpreter
(ru_maxrss), so torch's allocations count, not only Python's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file

from engines.weights import INDEX

ROOT = Path(__file__).resolve().parents[2]
ROWS, COLS, SHARDS = 12288, 4096, 3
"""Each shard holds one bf16 tensor of 96 MiB (192 MiB as float32) and a small one."""
MIB = 1 << 20
TENSOR_FP32 = ROWS * COLS * 4
SLICE_BOUND = 16 * MIB
"""What reading rows 1:3 of one big tensor may add to the peak (a read that converts the whole
tensor to float32 and then takes the rows adds 192 MiB: measured 183 MiB)."""

CHILD = """
import json, resource, sys
import torch
from engines.weights import Checkpoint

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

checkpoint = Checkpoint(sys.argv[1])
checkpoint.shape("big.0")
base = peak()
rows = checkpoint.read("big.1", slice(1, 3))
assert rows.shape[0] == 2 and rows.dtype == torch.float32 and bool((rows == 0.5).all())
after_rows = peak()
del rows
for key in sorted(checkpoint.files):
    tensor = checkpoint.read(key)
    assert tensor.dtype == torch.float32 and float(tensor[-1, -1]) == 0.5
    del tensor
print(json.dumps({"rows": after_rows - base, "all": peak() - base}))
"""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("lazy")
    weight_map = {}
    for i in range(SHARDS):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        save_file({f"big.{i}": torch.full((ROWS, COLS), 0.5, dtype=torch.bfloat16),
                   f"small.{i}": torch.full((4, 4), 0.5, dtype=torch.bfloat16)}, str(directory / name))
        weight_map |= {f"big.{i}": name, f"small.{i}": name}
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def test_reading_rows_costs_rows_and_reading_every_tensor_peaks_at_about_one(sharded):
    done = subprocess.run([sys.executable, "-c", CHILD, str(sharded)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    grew = json.loads(done.stdout)
    assert grew["rows"] < SLICE_BOUND, f"rows 1:3 of one tensor raised the peak by {grew['rows'] / MIB:.0f} MiB"
    # one tensor at a time: its float32 copy and its mapped pages, never the checkpoint's 576 MiB of float32
    # (every tensor kept: measured 568 MiB)
    assert grew["all"] < 1.6 * TENSOR_FP32, f"reading every tensor raised the peak by {grew['all'] / MIB:.0f} MiB"
