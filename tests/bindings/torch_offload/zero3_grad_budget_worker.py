"""One rank of the ZeRO-3 test of gradients held in host memory
(tests/bindings/torch_offload/test_param_offload_grad_budget.py): an fp32 model offloaded
with offload_parameters(comm=..., grad_host_budget=...) under OffloadAdamW, 3 micro-batches
per step, against torch by hand in the same process (each micro-batch's gradient
all-reduced and averaged, summed over the micro-batches, AdamW). Every parameter must be
bit-identical after every step; each rank holds the reduced sums of its own slices (4 bytes
per owned element) and the store moves no gradient byte.

    python zero3_grad_budget_worker.py DIR     (under strata launch)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from test_param_offload_grad_budget import Mlp  # noqa: E402


def main():
    root = sys.argv[1]
    comm = sd.Communicator()
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), durability="flush",
                              chunk_size="64KiB")
    model, ref = Mlp(), Mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    h = st.offload_parameters(model, store, working_set=1024, comm=comm,
                              grad_host_budget="1MiB")
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, store=store,
                          arithmetic="torch")
    owned = sum(h.state_numel(p) for _, p in h.parameters)
    total = sum(p.numel() for _, p in h.parameters)
    assert 0 < owned < total, (owned, total)  # each rank steps only its slices
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    for step in range(3):
        sums = [None] * len(list(ref.parameters()))
        opt.zero_grad(set_to_none=True)
        for _ in range(3):
            x, y = torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)
            for p in ref.parameters():
                p.grad = None
            F.mse_loss(ref(x), y).backward()
            red = []
            for p in ref.parameters():
                r = p.grad.clone()
                comm.all_reduce(r)
                red.append(r.div_(comm.size))
            sums = [r if t is None else t + r for t, r in zip(sums, red)]
            F.mse_loss(model(x), y).backward()
        assert h.stats()["grad_host_bytes"] == 4 * owned, (h.stats()["grad_host_bytes"], owned)
        for p, t in zip(ref.parameters(), sums):
            p.grad = t
        ref_opt.step()
        opt.step()
        for (n, p), r in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(h.read(p), r.detach()), (step, n)
    s = h.stats()
    assert (s["grad_bytes_written"], s["grad_bytes_read"]) == (0, 0), s
    opt.close()
    h.close()
    store.close()
    comm.close()
    print(f"OK zero3-grad-budget rank {rank}", flush=True)


if __name__ == "__main__":
    main()
