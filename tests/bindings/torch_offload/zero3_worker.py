"""One rank of the ZeRO-3 parameter-offload tests (tests/bindings/torch_offload/test_param_offload_ranks.py):
the same model trained with offload_parameters(comm=...) + OffloadAdamW and, beside it in
the same process, in memory with torch.optim.AdamW and gradients averaged by all_reduce;
every step's loss and every final parameter must be bit-identical.

    python zero3_worker.py strata DIR     (under strata launch: strata's own rendezvous)
    python zero3_worker.py torch DIR      (under torchrun: torch.distributed first, then
                                           Communicator.from_torch)
"""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from test_param_offload import Net, batch, loss_of, model_bytes, trainable_groups  # noqa: E402


def main():
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "torch":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        comm = sd.Communicator.from_torch()
    else:
        comm = sd.Communicator()
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), durability="flush",
                              chunk_size="64KiB")
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    h = st.offload_parameters(model, store, working_set=model_bytes(model) // 3, comm=comm)
    opt = st.OffloadAdamW(trainable_groups(model), lr=1e-2, store=store, arithmetic="torch")
    ref_opt = torch.optim.AdamW(trainable_groups(ref), lr=1e-2)
    for step in range(4):
        model.branch = ref.branch = step == 2  # a step whose order of use differs
        x, y = batch(step, rank)  # each rank its own data
        ref_opt.zero_grad()
        want = loss_of(ref, x, y)
        want.backward()
        for p in ref.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad)
                p.grad.div_(comm.size)
        ref_opt.step()
        opt.zero_grad()
        got = loss_of(model, x, y)
        got.backward()
        opt.step()
        assert got.item() == want.item(), (step, got.item(), want.item())
    for n, p in h.parameters:
        assert torch.equal(h.read(p), dict(ref.named_parameters())[n].detach()), n
    owned = sum(h.state_numel(p) for _, p in h.parameters)
    total = sum(p.numel() for _, p in h.parameters)
    assert 0 < owned < total, (owned, total)  # each rank steps only its slices
    opt.close()
    h.close()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert type(b) is torch.nn.Parameter and torch.equal(a, b), n
    store.close()
    comm.close()
    print(f"OK zero3 {mode} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
