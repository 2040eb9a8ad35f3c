"""bench/optimizer/step_subgroup_sweep.py in its short form: the sub-group sweep of
`strata bench step` (STRATA_CLI) at 2M parameters."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

STRATA = os.environ.get("STRATA_CLI")


@pytest.fixture
def disk_dir():
    # /var/tmp is on the real disk (O_DIRECT works).
    d = tempfile.mkdtemp(prefix="strata-sweep-", dir="/var/tmp")
    yield d
    subprocess.run(["rm", "-rf", d])


SWEEP = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "optimizer",
                     "step_subgroup_sweep.py")


def test_step_subgroup_sweep_short_form(disk_dir):
    if not STRATA:
        pytest.skip("STRATA_CLI (the strata tool) is not set")
    # The sweep of bench/optimizer/step_subgroup_sweep.py at 2M parameters, 2 rounds: sizes
    # ascending then descending, each size's ratio to the one-chunk run of the same round.
    path = os.path.join(disk_dir, "sweep")
    p = subprocess.run([sys.executable, SWEEP, "--strata", STRATA, "--path", path,
                        "--params", "2000000", "--chunk-size", "1MiB", "--chunks", "1/4,1,2",
                        "--rounds", "2", "--steps", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [s["sub_group_numel"] for s in doc["summary"]] == [65536, 262144, 524288]
    assert [(r["round"], r["chunks"]) for r in doc["results"]] == [
        (0, 0.25), (0, 1.0), (0, 2.0), (1, 2.0), (1, 1.0), (1, 0.25)]
    one = doc["summary"][1]
    assert one["ratio_to_one_chunk"] == 1.0 and one["ratios_per_round"] == [1.0, 1.0]
    for s in doc["summary"]:
        runs = {r["round"]: r["step_seconds"] for r in doc["results"] if r["chunks"] == s["chunks"]}
        ones = {r["round"]: r["step_seconds"] for r in doc["results"] if r["chunks"] == 1.0}
        assert s["ratios_per_round"] == [runs[0] / ones[0], runs[1] / ones[1]]
    assert doc["max_ratio"] == max(s["ratio_to_one_chunk"] for s in doc["summary"])
    assert doc["within_10_percent"] == (doc["max_ratio"] <= 1.10)
    # Every run moved the step's 12 bytes per parameter each way, and the stores are gone.
    assert {(r["bytes_read"], r["bytes_written"]) for r in doc["results"]} == {(24000000, 24000000)}
    assert not os.path.exists(path)
    bad = subprocess.run([sys.executable, SWEEP, "--strata", STRATA, "--path", path,
                          "--chunks", "1/4,2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--chunks must include 1" in bad.stderr
