"""examples/train_activations.py --quick (saved activations 4x a memory cgroup's limit,
bit-identical to torch in memory, torch killed under the limit; skipped where no memory
cgroup can be made) and bench/optimizer/activation_offload.py on a small model (every
field, sane values, the children's allocator settings; --no-spill; not a timing test)."""
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
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_activations.py"),
                        "--quick", "--dir", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "OK", out
    assert "bit-identical" in r.stdout and "exit status -9" in r.stdout, out


def test_bench_small(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "optimizer",
                                                     "activation_offload.py"),
                        "--tokens", "4096", "--blocks", "4", "--d-model", "32",
                        "--host-budget", "1MiB", "--iters", "2", "--warmup", "1", "--json",
                        "--path", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    for k in ("activation_bytes", "activation_bytes_spilled", "peak_rss_bytes",
              "peak_rss_bytes_in_memory"):
        assert isinstance(d[k], int) and d[k] > 0, k
    for k in ("activation_stall_seconds", "activation_fetch_seconds",
              "iteration_seconds_offloaded", "iteration_seconds_in_memory"):
        assert isinstance(d[k], float) and d[k] >= 0, k
    # 4 * tokens * (16 + d + blocks * 9d + 8): examples/train_activations.py's count
    assert d["activation_bytes"] == 4 * 4096 * (16 + 32 + 4 * 9 * 32 + 8)
    assert d["activation_bytes_spilled"] > 0
    h = d["host_pool"]
    assert h["activation_bytes"] == d["activation_bytes"] and h["activation_bytes_spilled"] == 0
    assert os.listdir(tmp_path / "b") == []
    for k in ("paired_ratio", "cpu_seconds", "offloaded_ratio"):
        assert isinstance(h[k], float) and h[k] > 0, k
    for k in ("minor_faults", "minor_faults_in_memory"):
        assert isinstance(d[k], int) and d[k] >= 0, k
    assert isinstance(h["minor_faults"], int) and d["cpu_seconds_in_memory"] > 0
    # every child got the same pinned allocator (the bench's default)
    assert d["config"]["malloc"] == {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                     "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}
    assert len(d["loadavg"]) == 2 and d["config"]["iters"] == 2


def test_bench_no_spill_default_malloc(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "optimizer",
                                                     "activation_offload.py"),
                        "--tokens", "2048", "--blocks", "2", "--d-model", "32", "--iters", "3",
                        "--warmup", "1", "--json", "--no-spill", "--malloc", "default",
                        "--path", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["iteration_seconds_offloaded"] is None and d["activation_bytes_spilled"] is None
    h = d["host_pool"]
    assert h["activation_bytes"] == 4 * 2048 * (16 + 32 + 2 * 9 * 32 + 8)
    assert isinstance(h["paired_ratio"], float) and h["paired_ratio"] > 0
    assert d["config"]["malloc"] == {} and d["config"]["no_spill"] is True
