"""examples/train_offload.py (the main job) on its tiny preset: the offloaded run under a
memory cgroup and the in-memory torch run agree bit for bit (skipped where no memory cgroup
can be made: not root, or no memory controller)."""
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
from memory_limit import MemoryLimit, MemoryLimitUnavailable  # noqa: E402


def test_tiny_preset_agrees_with_torch(tmp_path):
    try:
        MemoryLimit(256 << 20).close()
    except MemoryLimitUnavailable as e:
        pytest.skip(f"no memory cgroup: {e}")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_offload.py"),
                        "--preset", "tiny", "--allow-small", "--no-oom-demo",
                        "--dir", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "OK", out
    assert "all 28 parameters bit-identical" in r.stdout, out
    assert "under the 384 MiB limit" in r.stdout, out
