#!/usr/bin/python3
"""Parameter fetch across ranks (ZeRO-3 parameter offload, strata.torch.offload_parameters
with ``comm``): one rank of a job started by `strata launch` / torchrun.

Every rank builds the same model (--layers bias-free Linear(d, d), fp32, --params in all),
offloads its parameters with the job's Communicator, so that rank r keeps the r-th slice of
every parameter in its own store, and runs --iters timed forward passes under no_grad with
a working set of a quarter of the model, so that every forward fetches every parameter:
each rank reads its slices and the all-gather assembles them (fetch_partitioned).
The store of rank r is <STRATA_EMULATED_DRIVES entry r>/params-rank<r> inside
`strata emulate-drives` (each rank on its own throttled drive), else --path/params-rank<r>.

Rank 0 prints one JSON object:
  forward_seconds       the slowest rank's forward time, median over iterations
  forward_seconds_all   the slowest rank's time of each iteration
  fetch_gbps            params x 4 B / forward_seconds / 1e9: the whole model assembled on
                        every rank per forward (compute is a few ms of it)
  read_gbps_per_rank    (params x 4 / nproc) / forward_seconds / 1e9: each rank's slice
  bytes_fetched         rank 0's ParameterOffload.stats()["bytes_fetched"] of the last forward
  emulated_drive_bw     STRATA_EMULATED_DRIVE_BW (bytes/s; 0 outside emulate-drives)
plus nproc, params, layers, d_model, iters.

    strata emulate-drives --count 2 --bw 150MiB --path /var/tmp/x -- \\
        strata launch --nproc 2 -- /usr/bin/python3 bench/optimizer/param_fetch_ranks.py
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=32 * 2**20, help="parameters in all")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--path", default="/var/tmp", help="store directory outside emulate-drives")
    a = ap.parse_args()
    import torch
    import strata
    import strata.distributed
    from strata.torch import offload_parameters

    torch.manual_seed(0)
    comm = strata.distributed.Communicator()
    r, n = comm.rank, comm.size
    drives = [d for d in os.environ.get("STRATA_EMULATED_DRIVES", "").split(":") if d]
    base = drives[r] if drives else a.path
    store_dir = os.path.join(base, f"params-rank{r}")
    d = int(math.sqrt(a.params / a.layers))
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(a.layers)])
    params = sum(p.numel() for p in model.parameters())
    off = offload_parameters(model, path=store_dir, working_set=params * 4 // 4, comm=comm,
                             overwrite=True)
    try:
        x = torch.randn(4, d)
        times = []
        with torch.no_grad():
            model(x)  # warm-up (traces the order for prefetching)
            for _ in range(a.iters):
                comm.barrier()
                off.reset_stats()
                t0 = time.perf_counter()
                model(x)
                t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                comm.all_reduce(t, op="max")
                times.append(float(t[0]))
        st = off.stats()
    finally:
        off.close()
        shutil.rmtree(store_dir, ignore_errors=True)
    fwd = statistics.median(times)
    if r == 0:
        print(json.dumps({
            "bench": "param_fetch_ranks", "nproc": n, "params": params, "layers": a.layers,
            "d_model": d, "iters": a.iters, "forward_seconds": fwd,
            "forward_seconds_all": times, "fetch_gbps": params * 4 / fwd / 1e9,
            "read_gbps_per_rank": params * 4 / n / fwd / 1e9,
            "bytes_fetched": st["bytes_fetched"], "prefetch_hits": st["prefetch_hits"],
            "prefetch_misses": st["prefetch_misses"], "resident_hits": st["resident_hits"],
            "emulated_drive_bw": int(os.environ.get("STRATA_EMULATED_DRIVE_BW", "0") or 0),
            "store_dirs": [os.path.join(drives[q] if drives else a.path, f"params-rank{q}")
                           for q in range(n)]}))
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
