"""A checkpoint 4x a memory cgroup's limit imports into offloaded parameters and exports
again under that limit, bit-identical (bench/store/checkpoint_io.py: a 768 MiB safetensors
file, a 192 MiB limit on the child that imports torch, loads and saves it). Skipped where
no memory cgroup can be made. STRATA_LONG_TESTS=1: 2 GiB under 512 MiB, sharded export."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
BENCH = os.path.join(ROOT, "bench", "store", "checkpoint_io.py")
sys.path.insert(0, os.path.join(ROOT, "examples"))
from memory_limit import MemoryLimit, MemoryLimitUnavailable  # noqa: E402

LONG = os.environ.get("STRATA_LONG_TESTS") == "1"


@pytest.fixture(scope="module")
def cgroups():
    try:
        MemoryLimit(192 << 20).close()
    except MemoryLimitUnavailable as e:
        pytest.skip(f"no memory cgroup here: {e}")


def test_checkpoint_four_times_the_limit_round_trips_under_it(cgroups, tmp_path):
    size, limit = ((2 << 30), (512 << 20)) if LONG else ((768 << 20), (192 << 20))
    argv = [sys.executable, BENCH, "--size", str(size), "--memory-limit", str(limit),
            "--piece-bytes", str(4 << 20), "--no-fio", "--json", "--path", str(tmp_path)]
    if LONG:
        argv += ["--max-shard-size", "700MB"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["bit_identical"] is True
    assert out["checkpoint_bytes"] >= 4 * limit
    assert out["memory_limit_bytes"] == limit
    assert 0 < out["cgroup_peak_bytes"] <= limit
    assert out["import_bytes_per_s"] > 0 and out["export_bytes_per_s"] > 0
    assert os.listdir(tmp_path) == []  # the bench removed what it wrote
