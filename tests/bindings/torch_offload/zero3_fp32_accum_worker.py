"""One rank of the ZeRO-3 fp32-accumulation test
(tests/bindings/torch_offload/test_param_offload_fp32_accum.py): a bf16 model offloaded with
offload_parameters(comm=...) under OffloadAdamW (grad_accumulation_dtype default: fp32),
2 micro-batches per step, against torch by hand in the same process: each micro-batch's bf16
gradient widened to fp32, all-reduced and averaged in fp32, summed over the micro-batches in
fp32, AdamW on fp32 masters, the parameters the masters rounded. Every parameter must be
bit-identical after every step.

    python zero3_fp32_accum_worker.py DIR     (under strata launch)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from test_param_offload_fp32_accum import Net  # noqa: E402


def main():
    root = sys.argv[1]
    comm = sd.Communicator()
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), durability="flush",
                              chunk_size="64KiB")
    model, ref = Net(torch.bfloat16), Net(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)
    h = st.offload_parameters(model, store, working_set=256, comm=comm)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, store=store,
                          arithmetic="torch")
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    for step in range(3):
        sums = [None] * len(masters)
        opt.zero_grad(set_to_none=True)
        for _ in range(2):
            x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
            for p in ref.parameters():
                p.grad = None
            F.mse_loss(ref(x), y).backward()
            red = []
            for p in ref.parameters():
                r = p.grad.float()
                comm.all_reduce(r)
                red.append(r.div_(comm.size))
            sums = [r if t is None else t + r for t, r in zip(sums, red)]
            F.mse_loss(model(x), y).backward()
        for m, t in zip(masters, sums):
            m.grad = t
        ref_opt.step()
        with torch.no_grad():
            for p, m in zip(ref.parameters(), masters):
                p.copy_(m)
        opt.step()
        for (n, p), r in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(h.read(p), r.detach()), (step, n)
    owned = sum(h.state_numel(p) for _, p in h.parameters)
    total = sum(p.numel() for _, p in h.parameters)
    assert 0 < owned < total, (owned, total)  # each rank steps only its slices
    opt.close()
    h.close()
    store.close()
    comm.close()
    print(f"OK zero3-fp32-accum rank {rank}", flush=True)


if __name__ == "__main__":
    main()
