"""One rank of the two-rank loss-scaling test (tests/bindings/torch_optim/
test_loss_scale_ranks.py): data-parallel replicas, each rank its own OffloadAdamW (host
tier) over its own copy of the model and its own data, and a DynamicLossScaler with
``comm=``. Only rank 1's gradient overflows at step 2 (an inf put into it): both ranks skip
that step (parameters, state and step counts unchanged) and both lower the scale, as
DeepSpeed's rule says (hysteresis 1 here). Beside it, in the same process, torch by hand
(AdamW, gradients / scale) skipping the same step; every step bit-identical. Then the same
under ZeRO-3 (offload_parameters(comm=...), a scaler without comm: the step's gate decides
over the offload's communicator), rank 1's batch holding an inf at step 2, against torch
with all-reduced averaged gradients / scale.

    python loss_scale_worker.py DIR     (under strata launch)
"""
import os
import sys

import torch
import torch.nn.functional as F

import strata
import strata.distributed as sd
import strata.torch as st
from strata.torch.optim import DynamicLossScaler

INF = float("inf")
# init 2**10, window 2, hysteresis 1; overflow at step 2 only: by hand from the rule, the
# scale each step uses, and after each update()
USED = [1024, 1024, 1024, 512, 512]
AFTER = [1024, 1024, 512, 512, 512]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def main():
    root = sys.argv[1]
    comm = sd.Communicator()
    rank = comm.rank
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    data = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in USED]
    net, ref = model(), model()
    opt = st.OffloadAdamW(net.parameters(), lr=1e-2, path=os.path.join(root, f"r{rank}"),
                          tier="host", arithmetic="torch")
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2, hysteresis=1, comm=comm)
    for step, (x, y) in enumerate(data):
        assert scaler.get_scale() == USED[step], (step, scaler.get_scale())
        opt.zero_grad()
        scaler.scale(F.mse_loss(net(x), y)).backward()
        if step == 2 and rank == 1:
            net[2].weight.grad[0, 1] = INF
        before = [p.detach().clone() for p in net.parameters()]
        state_before = opt.state_dict()["state"]
        scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == AFTER[step], (step, scaler.get_scale())
        assert scaler.last_overflow == (step == 2), step
        if step == 2:  # skipped on both ranks, rank 0's gradients finite
            assert all(torch.equal(b, p) for b, p in zip(before, net.parameters()))
            after = opt.state_dict()["state"]
            assert sorted(after) == sorted(state_before)
            for i in after:
                for k in after[i]:
                    assert torch.equal(torch.as_tensor(after[i][k]),
                                       torch.as_tensor(state_before[i][k])), (i, k)
        else:  # torch by hand with this rank's (finite) gradients
            topt.zero_grad()
            (F.mse_loss(ref(x), y) * USED[step]).backward()
            for p in ref.parameters():
                p.grad.div_(USED[step])
            topt.step()
        for a, b in zip(ref.parameters(), net.parameters()):
            assert torch.equal(a, b), step
        steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
        assert steps == {float(step + 1 if step < 2 else step)}, (step, steps)
    steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
    assert steps == {4.0}, steps  # 5 iterations, one skipped
    assert scaler.overflows == 1
    opt.close()
    # comm= over parameters offloaded without a communicator: refused on both ranks
    off = model()
    h = st.offload_parameters(off, path=os.path.join(root, f"p{rank}"), working_set="1MiB")
    oopt = st.OffloadAdamW(off.parameters(), lr=1e-2, path=os.path.join(root, f"o{rank}"))
    F.mse_loss(off(data[0][0]), data[0][1]).backward()
    try:
        scaler.step(oopt)
        raise AssertionError("not refused")
    except ValueError as e:
        assert "offload_parameters(comm=...)" in str(e), e
    oopt.close()
    h.close()
    zero3(comm, root, data)
    comm.close()
    print(f"OK loss_scale rank {rank}", flush=True)


def zero3(comm, root, data):
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"z{rank}"), durability="flush",
                              chunk_size="64KiB")
    net, ref = model(), model()
    h = st.offload_parameters(net, store, working_set=2048, comm=comm)
    opt = st.OffloadAdamW(net.parameters(), lr=1e-2, store=store, arithmetic="torch")
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2, hysteresis=1)
    for step, (x, y) in enumerate(data):
        if step == 2 and rank == 1:
            x = x.clone()
            x[0, 3] = INF
        opt.zero_grad()
        scaler.scale(F.mse_loss(net(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        assert opt.last_step["skipped"] == (step == 2), step
        assert scaler.get_scale() == AFTER[step], (step, scaler.get_scale())
        if step != 2:
            topt.zero_grad()
            (F.mse_loss(ref(x), y) * USED[step]).backward()
            for p in ref.parameters():
                comm.all_reduce(p.grad)
                p.grad.div_(comm.size).div_(USED[step])
            topt.step()
        for n, p in h.parameters:
            assert torch.equal(h.read(p), dict(ref.named_parameters())[n].detach()), (step, n)
    opt.close()
    h.close()
    store.close()


if __name__ == "__main__":
    main()
