"""One rank of the resume-at-another-world-size test (test_universal_ranks.py), under
``strata launch``:

    python universal_worker.py train ROOT K     (2 ranks) ZeRO-3 offloaded parameters +
        OffloadAdamW trained K steps beside torch.optim.AdamW in memory; every step's loss
        and the final parameters bit-identical; then save_universal_checkpoint(ROOT/u) from
        both ranks, and rank 0 saves the in-memory reference (model and optimizer
        state_dict) to ROOT/ref.pt: the step-K state.
    python universal_worker.py resume ROOT N S  (N ranks) a model of other values and an
        OffloadAdamW of another lr load ROOT/u (ZeRO-3 over N ranks, or one process); its
        export at N re-imports bit-exactly (every file equal to ROOT/u's); then S more
        steps, compared bit for bit (losses, parameters, exp_avg, exp_avg_sq, steps) with
        torch.optim.AdamW in memory that loaded ROOT/ref.pt and runs the same steps at N.

Data: every step has one global batch of 6 samples (seeded by the step), rank r of N
takes rows [6r/N, 6(r+1)/N) and the mean loss over them; gradients are averaged over the
ranks. The reference averages them the way ZeRO-3 does (each element's sum over ranks by
the communicator's reduce_scatter_grads, divided by N, then all-gathered), so that it is the
uninterrupted run at size N, to the bit.
"""
import os
import sys

import torch

import strata
import strata.distributed as sd
import strata.torch as st

GLOBAL_BATCH = 6


class Net(torch.nn.Module):
    """Sizes that split unevenly over 2 and 3 ranks (130, 13, 52, 4 elements: a rank of 3
    owns none of the last bias)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 13)
        self.fc2 = torch.nn.Linear(13, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def groups(model):
    return [{"params": [model.fc1.weight, model.fc2.weight], "weight_decay": 0.1},
            {"params": [model.fc1.bias, model.fc2.bias], "weight_decay": 0.0}]


def local_batch(step, rank, size):
    g = torch.Generator().manual_seed(77 + step)
    x = torch.randn(GLOBAL_BATCH, 10, generator=g)
    y = torch.randn(GLOBAL_BATCH, 4, generator=g)
    b, e = GLOBAL_BATCH * rank // size, GLOBAL_BATCH * (rank + 1) // size
    return x[b:e], y[b:e]


def loss_of(model, step, rank, size):
    x, y = local_batch(step, rank, size)
    return torch.nn.functional.mse_loss(model(x), y)


def average_like_zero3(comm, ref):
    """Each gradient: reduce_scatter_grads (sum over ranks of this rank's slice) / size,
    all-gathered back whole: ZeRO-3's average, element for element."""
    for p in ref.parameters():
        g = p.grad.reshape(-1)
        b, e = comm.owned_range(g.numel())
        part = torch.empty(e - b)
        comm.reduce_scatter_grads(g, part)
        part.div_(comm.size)
        c = -(-g.numel() // comm.size)
        padded = torch.zeros(c)
        padded[:e - b] = part
        full = comm.all_gather(padded)
        p.grad.copy_(full[:g.numel()].view_as(p.grad))


def step_both(step, rank, size, comm, model, opt, ref, ref_opt):
    ref_opt.zero_grad()
    want = loss_of(ref, step, rank, size)
    want.backward()
    if comm is not None:
        average_like_zero3(comm, ref)
    ref_opt.step()
    opt.zero_grad()
    got = loss_of(model, step, rank, size)
    got.backward()
    opt.step()
    assert got.item() == want.item(), (step, got.item(), want.item())


def offloaded(root, rank, comm, seed):
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), durability="flush",
                              chunk_size="64KiB")
    torch.manual_seed(seed)
    model = Net()
    h = st.offload_parameters(model, store, working_set=4096, comm=comm)
    return store, model, h


def compare(model, h, opt, ref, ref_opt, where):
    core = opt._table.core
    names = opt._table.state_names()
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(h.read(p), r.detach()), (where, n)
        o = h.comm
        b, e = o.owned_range(p.numel()) if o is not None else (0, p.numel())
        hd = opt._table.handle_of(p)
        rs = ref_opt.state[r]
        assert core.step_count(hd) == int(rs["step"].item()), (where, n)
        for k, s in enumerate(names):
            mine = torch.from_numpy(core.read_state(hd, k))
            assert torch.equal(mine, rs[s].reshape(-1)[b:e]), (where, n, s)


def train(root, steps):
    comm = sd.Communicator()
    rank = comm.rank
    store, model, h = offloaded(os.path.join(root, "train"), rank, comm, 0)
    torch.manual_seed(0)
    ref = Net()
    opt = st.OffloadAdamW(groups(model), lr=1e-2, store=store, arithmetic="torch")
    ref_opt = torch.optim.AdamW(groups(ref), lr=1e-2)
    for step in range(steps):
        step_both(step, rank, comm.size, comm, model, opt, ref, ref_opt)
    compare(model, h, opt, ref, ref_opt, "train")
    st.save_universal_checkpoint(opt, model, os.path.join(root, "u"))
    if rank == 0:
        torch.save({"model": ref.state_dict(), "opt": ref_opt.state_dict()},
                   os.path.join(root, "ref.pt"))
        zero = os.path.join(root, "u", "zero")
        for n, r in ref.named_parameters():  # the files hold the step-K state, whole
            assert torch.equal(torch.load(os.path.join(zero, n, "fp32.pt"))["param"], r.detach()), n
            for s in ("exp_avg", "exp_avg_sq"):
                d = torch.load(os.path.join(zero, n, s + ".pt"))
                assert d["cat_dim"] == 0 and torch.equal(d["param"], ref_opt.state[r][s]), (n, s)
            assert torch.equal(torch.load(os.path.join(zero, n, "step.pt")),
                               ref_opt.state[r]["step"]), n
    comm.barrier()
    opt.close()
    h.close()
    store.close()
    comm.close()
    print(f"OK universal train rank {rank}", flush=True)


def same_files(a, b):
    """Every file of universal checkpoint ``a`` is in ``b`` with equal contents (tensor
    files byte for byte, the rest by value)."""
    for d, _, files in os.walk(a):
        for f in files:
            pa, pb = os.path.join(d, f), os.path.join(b, os.path.relpath(d, a), f)
            if f in ("step.pt", "optimizer_state.pt"):
                assert repr(torch.load(pa)) == repr(torch.load(pb)), pb
            else:
                with open(pa, "rb") as x, open(pb, "rb") as y:
                    assert x.read() == y.read(), pb


def replicas(root, comm):
    """Data parallel: every rank holds all of the state (a model in memory); the export
    with ``comm`` has each rank write its owned_range share of every file."""
    torch.manual_seed(3)
    model = Net()
    opt = st.OffloadAdamW(groups(model), lr=0.5, arithmetic="torch",
                          path=os.path.join(root, f"replica{comm.size}", f"rank{comm.rank}"))
    st.load_universal_checkpoint(opt, model, os.path.join(root, "u"))
    again = os.path.join(root, f"u{comm.size}dp")
    st.save_universal_checkpoint(opt, model, again, comm=comm)
    if comm.rank == 0:
        same_files(os.path.join(root, "u"), again)
    opt.close()


def resume(root, size, steps):
    comm = sd.Communicator() if size > 1 else None
    rank = comm.rank if comm is not None else 0
    assert (comm.size if comm is not None else 1) == size
    where = os.path.join(root, f"resume{size}")
    store, model, h = offloaded(where, rank, comm, 1)  # other values: all from the files
    opt = st.OffloadAdamW(groups(model), lr=0.5, store=store, arithmetic="torch")
    st.load_universal_checkpoint(opt, model, os.path.join(root, "u"))
    assert [g["lr"] for g in opt.param_groups] == [1e-2, 1e-2], opt.param_groups
    again = os.path.join(root, f"u{size}")
    st.save_universal_checkpoint(opt, model, again)
    if rank == 0:
        same_files(os.path.join(root, "u"), again)
        same_files(again, os.path.join(root, "u"))
    torch.manual_seed(2)
    ref = Net()
    saved = torch.load(os.path.join(root, "ref.pt"))
    ref.load_state_dict(saved["model"])
    ref_opt = torch.optim.AdamW(groups(ref), lr=0.5)
    ref_opt.load_state_dict(saved["opt"])
    compare(model, h, opt, ref, ref_opt, "loaded")
    k = int(ref_opt.state[ref.fc1.weight]["step"].item())
    for step in range(k, k + steps):
        step_both(step, rank, size, comm, model, opt, ref, ref_opt)
    compare(model, h, opt, ref, ref_opt, "resumed")
    if comm is not None:
        replicas(root, comm)
    owned = sum(h.state_numel(p) for _, p in h.parameters)
    total = sum(p.numel() for _, p in h.parameters)
    assert (owned < total) == (size > 1), (owned, total)
    opt.close()
    h.close()
    store.close()
    if comm is not None:
        comm.barrier()
        comm.close()
    print(f"OK universal resume{size} rank {rank}", flush=True)


if __name__ == "__main__":
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "train":
        train(root, int(sys.argv[3]))
    else:
        resume(root, int(sys.argv[3]), int(sys.argv[4]))
