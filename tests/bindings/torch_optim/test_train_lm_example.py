"""examples/train_lm.py (the main job's training run) with a small --steps: its verdict
follows the comparison with torch.optim.AdamW, whatever the step count."""
import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "train_lm.py")
SMALL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--context", "32", "--batch", "4",
         "--corpus-bytes", "100000", "--threads", "1", "--device", "cpu"]


def run_example(tmp_path, *args):
    return subprocess.run([sys.executable, EXAMPLE, "--dir", str(tmp_path / "store"), *SMALL,
                           *args], capture_output=True, text=True, timeout=300)


def test_ten_steps_that_agree_with_torch_pass(tmp_path):
    p = run_example(tmp_path, "--steps", "10")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.endswith("\nOK\n"), p.stdout
    # strata clips inside its step (summing the norm in another order than torch's
    # clip_grad_norm_): within the tolerance, not bit-identical
    diff = float(re.search(r"max \|parameter difference\|: (\S+)", p.stdout).group(1))
    assert diff <= 1e-4
    assert "relative difference 0.0000%" in p.stdout
    assert "the loss drop is checked from 100 steps on; 10 steps: checked against torch only" \
        in p.stdout
    # the store's objects carry the model's parameter names
    import strata
    with strata.Store.open(str(tmp_path / "store"), create=False) as s:
        keys = set(s.keys())
    assert "optim/p/p0:tok.weight/exp_avg" in keys, sorted(keys)[:8]


@pytest.mark.parametrize("overlap", [[], ["--no-overlap"]])
def test_without_clipping_the_runs_are_bit_identical(tmp_path, overlap):
    # --arithmetic torch (the default); overlap_backward (the default) changes nothing
    p = run_example(tmp_path, "--steps", "10", "--max-grad-norm", "0", *overlap)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "max |parameter difference|: 0.000e+00" in p.stdout
    assert p.stdout.endswith("\nOK\n"), p.stdout


def test_ten_steps_that_disagree_with_torch_fail(tmp_path):
    # simd arithmetic differs from torch by an ulp here and there: a zero tolerance fails
    p = run_example(tmp_path, "--steps", "10", "--arithmetic", "simd", "--param-tolerance", "0")
    assert p.returncode == 1, p.stdout + p.stderr
    diff = float(re.search(r"max \|parameter difference\|: (\S+)", p.stdout).group(1))
    assert diff > 0
    assert "FAIL: the strata and torch runs disagree" in p.stdout
    assert p.stdout.endswith("\nFAILED\n"), p.stdout


def test_steps_must_be_positive(tmp_path):
    p = run_example(tmp_path, "--steps", "0")
    assert p.returncode == 2 and "--steps: must be >= 1, got 0" in p.stderr, p.stderr
