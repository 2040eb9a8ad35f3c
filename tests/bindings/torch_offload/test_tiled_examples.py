"""examples/train_tiled.py --quick (an embedding table larger than a memory cgroup's limit
and 10x the working set trains under the limit, bit-identical to torch in memory, the
state_dict keys the model's own, torch killed under the limit; skipped where no memory
cgroup can be made) and bench/optimizer/tiled_offload.py on a small model (every field,
sane values; not a timing test)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
from memory_limit import MemoryLimit, MemoryLimitUnavailable  # noqa: E402


def test_example_quick(tmp_path):
    try:
        MemoryLimit(256 << 20).close()
    except MemoryLimitUnavailable as e:
        pytest.skip(f"no memory cgroup: {e}")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_tiled.py"), "--quick",
                        "--dir", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert r.stdout.strip().splitlines()[-1] == "OK", out
    assert "bit-identical" in r.stdout and "exit status -9" in r.stdout, out
    assert "tiled parameters: ['emb.weight']" in r.stdout, out


def test_bench_small(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "optimizer",
                                                     "tiled_offload.py"),
                        "--vocab", "4096", "--d-model", "64", "--seq", "16", "--iters", "2",
                        "--warmup", "1", "--working-set", "256KiB", "--tile-bytes", "64KiB",
                        "--json", "--path", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    for k in ("tiled_iteration_seconds", "whole_iteration_seconds", "tiled_ratio",
              "tile_fetch_seconds", "tile_stall_seconds", "max_abs_loss_difference"):
        assert isinstance(d[k], float) and d[k] >= 0, k
    assert d["table_bytes"] == 4 * 4096 * 64 and d["tile_bytes"] == 64 << 10
    # 16 blocks, read by the head in forward (last to first, the first 2 ahead of the use)
    # and in backward but for the 3 the forward keeps for it (2 in use and in flight, 1
    # more with room in the 256 KiB working set); the embedding reads only its ids' rows
    # (at most 2 x 16 per iteration)
    assert d["tile_blocks_fetched"] == 16 + 13 and d["tile_blocks_ahead"] == 2
    rows, layers = 4 * 16 * 64 * 4, 2 * (64 * 64 + 64) * 4
    block = d["table_bytes"] // 16
    assert 29 * block < d["bytes_fetched"] <= 29 * block + 2 * layers + rows
    # the head's gradient written whole, the embedding's rows read, added and written (and
    # the layers' gradients)
    assert d["grad_bytes_read"] <= rows + layers
    assert d["table_bytes"] < d["grad_bytes_written"] <= d["table_bytes"] + rows + layers
    assert d["max_abs_loss_difference"] < 1e-4
