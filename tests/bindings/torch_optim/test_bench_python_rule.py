"""bench/optimizer/python_rule.py on a small state: one JSON object with every field, one
Python call per sub-group, and the Python Adam within fp32 rounding of the C++ one."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "optimizer", "python_rule.py")


def test_small_run_reports_every_field(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--json", "--params", "400000", "--tensors",
                          "2", "--chunk", "256KiB", "--iters", "2", "--warmup", "0", "--path",
                          str(tmp_path / "b")], check=True, capture_output=True, text=True,
                         timeout=300).stdout
    r = json.loads(out)
    for k in ("python_rule_step_seconds", "builtin_adam_step_seconds", "io_bound_seconds",
              "python_over_builtin"):
        assert r[k] > 0, k
    assert r["sub_group_numel"] == 65536
    assert r["python_calls_per_step"] == 2 * 4  # 200000 elements = 4 sub-groups of 65536
    assert all(len(v) == 2 for v in r["samples"].values())
    assert r["max_abs_diff_python_vs_builtin"] < 1e-5
