"""load_safetensors over 2 ranks into ZeRO-3 partitioned parameters: each rank reads and
stores only its slices (tests/bindings/torch_checkpoints/zero3_load_worker.py)."""
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402
import spec_files  # noqa: E402
from test_safetensors_load import values  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero3_load_worker.py")


def test_two_ranks_each_read_their_slices(tmp_path):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    spec_files.write(tmp_path / "m.safetensors", values(9))
    g = torch.Generator().manual_seed(9)
    big = {"0.weight": torch.randn(512, 256, generator=g), "0.bias": torch.randn(512, generator=g),
           "1.weight": torch.randn(256, 512, generator=g), "1.bias": torch.randn(256, generator=g)}
    spec_files.write(tmp_path / "big.safetensors", big)
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "100", "--", sys.executable, WORKER, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    _check_ranks(r, "zero3 load", range(2), lambda k: f"[rank {k}] ")
