"""strata's own checkpoints (``resume=True``) resume only at the world size they were
written at; at another one, offload_parameters and the optimizer refuse with an error that
names both sizes and the route that does change it (the universal layout,
test_universal_ranks.py). Workers: world_size_worker.py (about 20 s on 2 cores)."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "world_size_worker.py")
ROUTE = ("strata's own checkpoints resume only at the world size they were written at; to "
         "change it, save with strata.torch.save_universal_checkpoint and load with "
         "load_universal_checkpoint at the new size (docs/checkpoints.md, 'Optimizer state at "
         "another world size')")


def _launch(nproc, mode, root):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    cmd = [cli, "launch", "--nproc", str(nproc), "--master-port", str(_free_port_pair()),
           "--timeout", "100", "--", sys.executable, WORKER, mode, str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150)


def _alone(mode, root):
    r = subprocess.run([sys.executable, WORKER, mode, str(root)], capture_output=True,
                       text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_two_ranks_resumed_alone_is_refused(tmp_path):
    _check_ranks(_launch(2, "train", tmp_path), "train", range(2), lambda k: f"[rank {k}] ")
    assert _alone("resume", tmp_path) == (
        "ERR NotFoundError: NotFound: offload_parameters(resume=True): the store holds no "
        "parameter '0.weight' (key 'params/0.weight'); this store holds rank 0's part of parameters "
        "partitioned over 2 rank(s) ('params/0.weight'), this run has one process: " + ROUTE)
    # the parameters offloaded anew: the optimizer's checkpoint holds rank 0's slices
    assert _alone("fresh", tmp_path) == (
        "ERR ValueError: checkpointed parameter p0 has 65 elements, the model's has 130; it "
        "matches a checkpoint written by ZeRO-3 over 2 ranks (the 130 elements partitioned): "
        + ROUTE)


def test_two_ranks_resumed_on_three_is_refused(tmp_path):
    _check_ranks(_launch(2, "train", tmp_path), "train", range(2), lambda k: f"[rank {k}] ")
    r = _launch(3, "resume", tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for k in range(2):
        assert (f"[rank {k}] ERR ValueError: offload_parameters(resume=True): rank {k} of 3's "
                f"store holds rank {k} of 2's part of parameter '0.weight' (key 'params/0.weight'): "
                + ROUTE) in out, out
    # rank 2 had no store at size 2
    assert ("[rank 2] ERR NotFoundError: NotFound: offload_parameters(resume=True): rank 2's "
            "store holds no part of parameter '0.weight' (key 'params/0.weight')\n") in out, out


def test_resume_at_the_same_size_still_works(tmp_path):
    _check_ranks(_launch(2, "train", tmp_path), "train", range(2), lambda k: f"[rank {k}] ")
    _check_ranks(_launch(2, "resume", tmp_path), "resume", range(2), lambda k: f"[rank {k}] ")


def test_one_process_resumed_on_two_is_refused(tmp_path):
    assert _alone("train", tmp_path) == "OK train rank 0"
    r = _launch(2, "resume", tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert ("[rank 0] ERR NotFoundError: NotFound: offload_parameters(resume=True): rank 0's "
            "store holds no part of parameter '0.weight' (key 'params/0.weight'); it holds the "
            "whole parameter, written by one process: " + ROUTE) in out, out


def test_swapped_rank_stores_are_named(tmp_path):
    _check_ranks(_launch(2, "train", tmp_path), "train", range(2), lambda k: f"[rank {k}] ")
    r = _launch(2, "swapped", tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for k in range(2):
        assert (f"[rank {k}] ERR ValueError: offload_parameters(resume=True): rank {k} of 2's "
                f"store holds rank {1 - k}'s part of parameter '0.weight' (key "
                f"'params/0.weight'): each rank must open the store it wrote (rank {1 - k}'s "
                f"store path given to rank {k}?)\n") in out, out
