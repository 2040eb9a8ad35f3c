"""Resume at another world size (issue 27): 2 ranks train ZeRO-3 offloaded parameters with
OffloadAdamW and save DeepSpeed's universal checkpoint layout; the state is resumed on 1
and on 3 ranks, its re-export at each size is the same files, and the next steps are
bit-identical to torch.optim.AdamW continuing in memory at that size from the same step
(tests/bindings/torch_checkpoints/universal_worker.py; about 25 s on 2 cores)."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "universal_worker.py")


def _launch(nproc, *args):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    cmd = [cli, "launch", "--nproc", str(nproc), "--master-port", str(_free_port_pair()),
           "--timeout", "100", "--", sys.executable, WORKER, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150)


def test_trained_on_2_resumed_on_1_and_3(tmp_path):
    _check_ranks(_launch(2, "train", tmp_path, 3), "universal train", range(2),
                 lambda k: f"[rank {k}] ")
    one = subprocess.run([sys.executable, WORKER, "resume", str(tmp_path), "1", "3"],
                         capture_output=True, text=True, timeout=150)
    assert one.returncode == 0 and "OK universal resume1 rank 0" in one.stdout, \
        one.stdout + one.stderr
    _check_ranks(_launch(3, "resume", tmp_path, 3, 3), "universal resume3", range(3),
                 lambda k: f"[rank {k}] ")
