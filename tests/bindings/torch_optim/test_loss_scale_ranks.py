"""DynamicLossScaler over 2 ranks under strata launch (tests/bindings/torch_optim/
loss_scale_worker.py): only rank 1's gradient overflows; both ranks skip the step and lower
the scale (the overflow flag all-reduced with MAX), every step bit-identical to torch AdamW
by hand; comm= over parameters offloaded without a communicator refused on both ranks;
under ZeRO-3 (offload_parameters(comm=...)) the step's own gate decides for every rank, bit
for bit against torch with all-reduced gradients."""
import os
import subprocess
import sys

import pytest

# the launch helpers of tests/bindings/test_distributed.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loss_scale_worker.py")


def test_only_rank_1_overflows_both_skip_and_lower_the_scale(tmp_path):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "200", "--", sys.executable, WORKER, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=250)
    _check_ranks(r, "loss_scale", range(2), lambda k: f"[rank {k}] ")
