"""The Python guide's partitioned-read example (docs/guide-python.md): every rank keeps only
its slice of a tensor in its own store; fetch_partitioned() has each rank read its slice and
all-gathers the whole tensor. Run under a launcher (rank r's store: DIR/rank<r>):
  PYTHONPATH=build/python strata launch -n 2 /usr/bin/python3 examples/guide_partitioned.py DIR
Exit status 0 on every rank when every check holds.
"""
import os
import sys

import torch

import strata
import strata.distributed as sd

root = sys.argv[1]
# [partitioned]
with sd.Communicator() as comm:                        # RANK, WORLD_SIZE, MASTER_* from the launcher
    store = strata.Store.open(os.path.join(root, f"rank{comm.rank}"), host_budget="16MiB",
                              staging="16MiB", chunk_size="1MiB")
    full = torch.arange(1_000_003, dtype=torch.float32) % 1000
    comm.put_partitioned(store, "emb", full, overwrite=True)  # each rank stores its slice
    out = torch.empty_like(full)
    comm.fetch_partitioned(store, "emb", out)          # read own slice, all-gather the rest
    begin, end = comm.owned_range(full.numel())
    assert torch.equal(out, full)
    print(f"rank {comm.rank} of {comm.size}: owns [{begin}, {end}), fetched all {out.numel()}: OK")
    store.close()
# [partitioned]
