"""examples/train_offload.py (the main job) on its tiny preset: the offloaded run under a
memory cgroup and the in-memory torch run agree bit for bit, and the lines before ``OK``
give the step time ratio and the offloaded step's I/O bound (skipped where no memory cgroup
can be made: not root, or no memory controller)."""
import os
import re
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
                        "--dir", str(tmp_path / "store"), "--drive-read-gbps", "1",
                        "--drive-write-gbps", "1"],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "OK", out
    assert "all 28 parameters bit-identical" in r.stdout, out
    assert "under the 384 MiB limit" in r.stdout, out
    # beside OK: the step time ratio, the steady prefetch (steps 2-3 summed) and the
    # offloaded step's I/O bound (medians of steps 2-3)
    ratio = re.fullmatch(r"offloaded / in-memory step time: (\d+\.\d\d) \((\d+\.\d\d) s / "
                         r"(\d+\.\d\d) s, median of steps 2-3\)", lines[-4])
    assert ratio and float(ratio[1]) > 0, out
    steady = re.fullmatch(r"steady prefetch \(steps 2-3\): (\d+) misses, (\d+) hits, stalled "
                          r"(\d+\.\d\d) of (\d+\.\d\d) s of fetch \(stall/fetch (\d+\.\d\d)\)",
                          lines[-3])
    assert steady, out
    # the 2 MiB working set cannot hold the model: steps 2-3 fetch parameters again
    assert int(steady[1]) + int(steady[2]) > 0, out
    bound = re.fullmatch(
        r"I/O bound of the offloaded step: (\d+\.\d\d) s \((\d+\.\d\d) GB moved per step: "
        r"read \d+\.\d\d GB \((\d+\.\d) B/parameter\), written \d+\.\d\d GB "
        r"\((\d+\.\d) B/parameter\); drive read 1\.00, write 1\.00 GB/s\); "
        r"offloaded step / I/O bound (\d+\.\d\d)", lines[-2])
    assert bound, out
    # at 1 GB/s each way the bound in seconds is the GB moved
    assert float(bound[1]) == pytest.approx(float(bound[2]), abs=0.011), out
    # fp32 AdamW, updated in backward with max_grad_norm: each gradient written (4 B, for
    # a redo when the step clips), the master -- the parameter's object -- and moments
    # written (12), whether the step clipped (stepped after backward) or not; reads:
    # parameters fetched (>= 4), moments (8), and when it clipped gradients and masters (8)
    assert float(bound[4]) == 16.0 and float(bound[3]) >= 12.0, out
    assert float(bound[5]) > 0, out
