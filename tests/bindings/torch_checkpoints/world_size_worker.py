"""One rank of test_resume_world_size.py, under ``strata launch`` (or alone for one
process):

    python world_size_worker.py train ROOT      ZeRO-3 offloaded parameters (each rank's
        store ROOT/rank<r>) + OffloadAdamW, 2 steps, checkpoint.
    python world_size_worker.py resume ROOT     offload_parameters(resume=True) and
        OffloadAdamW(resume=True) at this run's world size; prints the error's type and
        message ("ERR <type>: <message>") or OK.
    python world_size_worker.py fresh ROOT      one process: the parameters offloaded anew
        (overwrite=True), the optimizer resumed: prints the optimizer's error the same way.
    python world_size_worker.py swapped ROOT    as resume, rank r opening rank (size-1-r)'s
        store.
"""
import os
import sys

import torch

import strata
import strata.distributed as sd
import strata.torch as st


def main():
    mode, root = sys.argv[1], sys.argv[2]
    size = int(os.environ.get("WORLD_SIZE", "1"))
    comm = sd.Communicator() if size > 1 else None
    rank = comm.rank if comm is not None else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 13), torch.nn.Linear(13, 4))
    which = size - 1 - rank if mode == "swapped" else rank
    store = strata.Store.open(os.path.join(root, f"rank{which}"), durability="flush")
    try:
        h = st.offload_parameters(model, store, working_set=4096, comm=comm,
                                  resume=(mode in ("resume", "swapped")), overwrite=(mode == "fresh"))
        opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store,
                              resume=(mode != "train"))
    except (ValueError, strata.Error) as e:
        print(f"ERR {type(e).__name__}: {e}", flush=True)
        return
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        model(torch.randn(3, 10, generator=g)).sum().backward()
        opt.step()
        opt.zero_grad()
    opt.checkpoint()
    opt.close()
    h.close()
    store.close()
    print(f"OK {mode} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
