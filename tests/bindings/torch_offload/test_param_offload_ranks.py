"""Parameter offload over 2 ranks (ZeRO-3: partitioned parameters, fetch_partitioned,
gradients reduce-scattered), bit-exact against in-memory torch with all-reduced gradients,
under strata launch and under torchrun beside torch.distributed
(tests/bindings/torch_offload/zero3_worker.py).
"""
import os
import subprocess
import sys

# the launch helpers of tests/bindings/test_distributed.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli, torchrun

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero3_worker.py")


def test_two_ranks_under_strata_launch(tmp_path):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "200", "--", sys.executable, WORKER, "strata", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=250)
    _check_ranks(r, "zero3 strata", range(2), lambda k: f"[rank {k}] ")


def test_two_ranks_under_torchrun(tmp_path):
    r = torchrun(WORKER, ["torch", tmp_path], tmp_path / "logs", timeout=250)
    _check_ranks(r, "zero3 torch", range(2), lambda k: f"[default{k}]:")
