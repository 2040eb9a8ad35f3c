"""strata.torch.offload_activations against the same training in memory: losses, gradients
and parameters after AdamW steps compared with torch.equal (moving bytes is exact), in the
host pool, spilled to the store, with checkpointing, retained graphs and double backward,
views, micro-batch accumulation and parameter offload; the trace's prefetch; the counters;
bad arguments."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import strata
import strata.torch as st

D, H, B = 32, 128, 64  # input, hidden, batch: a hidden activation is B*H*4 = 32 KiB
ACT = B * H * 4


class Net(torch.nn.Module):
    def __init__(self, layers=3, ckpt=None):
        super().__init__()
        self.inp = torch.nn.Linear(D, H)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(H, H) for _ in range(layers))
        self.out = torch.nn.Linear(H, 4)
        self.ckpt = ckpt  # None, or use_reentrant True/False

    def block(self, i, h):
        return torch.tanh(self.blocks[i](h)) + h

    def forward(self, x, order=None):
        h = F.gelu(self.inp(x))
        for i in (order or range(len(self.blocks))):
            if self.ckpt is None:
                h = self.block(i, h)
            else:
                h = checkpoint(self.block, i, h, use_reentrant=self.ckpt)
        return self.out(h).square().mean()


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, D, generator=g) for _ in range(n)]


def train(act, steps=3, ckpt=None, micro=1, orders=None, param_offload=False, tmp=None,
          settle=False):
    torch.manual_seed(0)
    m = Net(ckpt=ckpt)
    handle = None
    if param_offload:
        handle = st.offload_parameters(m, path=str(tmp / "params"), working_set="64KiB")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses, grads = [], []
    data = batches(steps * micro)
    for s in range(steps):
        for k in range(micro):
            x = data[s * micro + k]
            order = orders[s] if orders else None
            if act is None:
                loss = m(x, order)
            else:
                with act:
                    loss = m(x, order)
                if settle:  # every spill written: entries on NVMe, counters deterministic
                    act.wait_spills()
            (loss / micro).backward()
            losses.append(loss.detach().clone())
        grads.append([None if p.grad is None else p.grad.detach().clone()
                      for p in m.parameters()])
        opt.step()
        opt.zero_grad()
    params = [p.detach().clone() for p in m.parameters()]
    if handle is not None:
        handle.close()
    return losses, grads, params


def same(a, b):
    la, ga, pa = a
    lb, gb, pb = b
    assert len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))
    for x, y in zip(ga, gb):
        assert all((u is None and v is None) or torch.equal(u, v) for u, v in zip(x, y))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


@pytest.fixture
def act_store(tmp_path):
    s = strata.Store.open(str(tmp_path / "act"), host_budget="8MiB", staging="16MiB",
                          chunk_size="1MiB", durability="flush", workers=2)
    yield s
    if not s.closed:
        s.close()


def make(store, **kw):
    kw.setdefault("min_bytes", 4096)
    return st.offload_activations(store, **kw)


def test_host_pool_only_is_exact_and_counts_bytes(act_store):
    act = make(act_store)
    same(train(act), train(None))
    s = act.stats()
    # per forward: x (B*D*4, the first linear's input), inp's output (saved by gelu),
    # gelu's output (the first block's input), per block tanh's result (ACT) and the next
    # linear's input (the block's output, ACT); out's output (B*4*4 bytes, saved by
    # square) is under min_bytes: kept
    per_step = B * D * 4 + 2 * ACT + 3 * (ACT + ACT)
    assert s["activation_bytes"] == 3 * per_step
    assert s["bytes_spilled"] == s["bytes_written"] == s["spills"] == 0
    assert s["prefetch_hits"] == s["prefetch_misses"] == 0
    assert s["pool_peak_bytes"] == per_step and s["pool_bytes"] == 0
    assert s["entries_alive"] == 0
    act.close()


def test_spilled_is_exact_and_frees_every_object(act_store):
    act = make(act_store, host_budget_bytes=0)
    same(train(act, settle=True), train(None))
    act.wait_spills()  # (the deletes of freed entries' objects are asynchronous)
    s = act.stats()
    assert s["bytes_spilled"] == s["activation_bytes"] > 0
    assert s["bytes_written"] == s["bytes_spilled"]  # the wear counter: every spill landed
    assert s["spills"] == 3 * 9  # every entry of every step (9 per forward)
    assert s["entries_alive"] == 0 and act_store.keys("activations/") == []
    assert s["fetch_seconds"] > 0 and s["bytes_fetched"] > 0
    act.close()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint(act_store, reentrant):
    act = make(act_store, host_budget_bytes=ACT)
    same(train(act, ckpt=reentrant), train(None, ckpt=reentrant))
    s = act.stats()
    assert s["activation_bytes"] > 0 and s["entries_alive"] == 0


def test_checkpoint_reentrant_offloads_only_block_inputs(act_store):
    act = make(act_store)
    train(act, steps=1, ckpt=True)
    # x, inp's output, gelu's output (the first block's input), blocks 2-3's inputs and
    # out's input (block 3's output); nothing inside the blocks
    assert act.stats()["activation_bytes"] == B * D * 4 + 2 * ACT + 3 * ACT


def test_retain_graph_and_double_backward(act_store):
    def run(act):
        torch.manual_seed(0)
        m = Net()
        x = batches(1)[0].requires_grad_()
        if act is None:
            loss = m(x)
        else:
            with act:
                loss = m(x)
        loss.backward(retain_graph=True)
        g1 = [p.grad.clone() for p in m.parameters()]
        loss.backward(retain_graph=True)  # needed again: kept until the graph goes
        g2 = [p.grad.clone() for p in m.parameters()]
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.square().sum(), x)
        return g1 + g2 + [gx.detach(), ggx]

    act = make(act_store, host_budget_bytes=0)
    out = run(act)
    ref = run(None)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    act.wait_spills()
    assert act.stats()["entries_alive"] == 0  # the graph is gone: every entry freed
    assert act_store.keys("activations/") == []


def test_view_and_base_saved_once(act_store):
    act = make(act_store, host_budget_bytes=0)
    w = torch.randn(H, H, requires_grad=True)
    x = torch.randn(B, H)
    with act:
        h = torch.tanh(x @ w)  # tanh saves h
        y = (h @ h.t()).sum() + (h[:, : H // 2] * h[:, H // 2:]).sum()  # views of h
    s = act.stats()
    # x (input of the mm, B*H*4) and h once: tanh's result, mm's self and mat2, the two
    # halves mul saves (each spans more than half of h's storage: the whole is taken)
    assert s["activation_bytes"] == B * H * 4 + ACT
    assert s["tensors_deduplicated"] == 4
    y.backward()
    w2 = w.detach().clone().requires_grad_()
    h2 = torch.tanh(x @ w2)
    ((h2 @ h2.t()).sum() + (h2[:, : H // 2] * h2[:, H // 2:]).sum()).backward()
    assert torch.equal(w.grad, w2.grad)


def test_small_view_of_a_large_storage_is_copied_alone(act_store):
    act = make(act_store, host_budget_bytes=0, min_bytes=1)
    big = torch.randn(B, H)
    w = torch.randn(H, 4, requires_grad=True)
    with act:
        y = (big[2:6] @ w).sum()  # 4 of B rows: that range only
    assert act.stats()["activation_bytes"] == 4 * H * 4
    act.wait_spills()
    y.backward()
    assert torch.equal(w.grad, big[2:6].t() @ torch.ones(4, 4))


def test_micro_batch_accumulation(act_store):
    act = make(act_store, host_budget_bytes=2 * ACT)
    same(train(act, micro=2), train(None, micro=2))
    assert act.stats()["bytes_spilled"] > 0


def test_with_parameter_offload(act_store, tmp_path):
    act = make(act_store, host_budget_bytes=ACT)
    ref = train(None)
    out = train(act, param_offload=True, tmp=tmp_path)
    same(out, ref)
    s = act.stats()
    # the linears' inputs are offloaded too (parameter offload's hooks hand them over)
    assert s["activation_bytes"] == 3 * (B * D * 4 + 2 * ACT + 3 * (ACT + ACT))
    assert s["bytes_spilled"] > 0 and s["entries_alive"] == 0


def test_trace_prefetches_after_the_first_iteration_and_order_change_falls_back(act_store):
    # the pool holds the last entry packed (backward's first); the other 8 are on NVMe
    act = make(act_store, host_budget_bytes=ACT)
    train(act, steps=1, settle=True)
    first = act.stats()
    assert first["prefetch_hits"] == 0 and first["prefetch_misses"] == 8  # no trace yet
    act.reset_stats()
    train(act, steps=2, settle=True)
    s = act.stats()
    assert s["prefetch_hits"] == 2 * 8 and s["prefetch_misses"] == 0
    assert s["bytes_fetched"] == 2 * (B * D * 4 + 7 * ACT)
    act.reset_stats()
    # another forward (block 2 skipped: other sizes): on demand, no error, still exact
    orders = [[0, 1]]
    out = train(act, steps=1, orders=orders, settle=True)
    ref = train(None, steps=1, orders=orders)
    same(out, ref)
    s = act.stats()
    assert s["trace_mismatches"] == 1
    assert s["prefetch_hits"] == 0 and s["prefetch_misses"] == 6
    act.reset_stats()
    train(act, steps=1, orders=orders, settle=True)  # its order is the trace now
    s = act.stats()
    assert s["prefetch_hits"] == 6 and s["prefetch_misses"] == 0 and s["trace_mismatches"] == 0


def test_unpredicted_backward_order_falls_back_mid_way(act_store):
    """Same forward, another backward order (the gradients of two independent branches
    asked in the other order): the trace is left at the first surprise."""
    w1 = torch.randn(H, H, requires_grad=True)
    w2 = torch.randn(H, H, requires_grad=True)
    x = torch.randn(B, H)

    def step(act, first):
        with act:
            a = torch.tanh(x @ w1)
            b = torch.tanh(x @ w2)
            la, lb = (a * a).sum(), (b * b).sum()
        act.wait_spills()
        for loss in ((la, lb) if first == "a" else (lb, la)):
            loss.backward()

    act = make(act_store, host_budget_bytes=0)
    step(act, "a")
    step(act, "a")
    s = act.stats()
    assert s["trace_mismatches"] == 0 and s["prefetch_hits"] > 0
    act.reset_stats()
    w1.grad = w2.grad = None
    step(act, "b")
    s = act.stats()
    assert s["trace_mismatches"] == 1 and s["prefetch_misses"] > 0
    g1, g2 = w1.grad, w2.grad
    w1.grad = w2.grad = None
    (torch.tanh(x @ w2) ** 2).sum().backward()
    (torch.tanh(x @ w1) ** 2).sum().backward()
    assert torch.equal(w1.grad, g1) and torch.equal(w2.grad, g2)


def test_prefetch_off_is_on_demand(act_store):
    act = make(act_store, host_budget_bytes=0, prefetch=False)
    train(act, steps=2, settle=True)
    s = act.stats()
    assert s["prefetch_hits"] == 0 and s["prefetch_misses"] > 0


def test_in_place_change_after_save_raises(act_store):
    act = make(act_store)
    w = torch.randn(H, H, requires_grad=True)
    with act:
        h = torch.randn(B, H) @ w
        y = torch.tanh(h)
    y.mul_(2)  # tanh's saved result changed
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_temporary_store_and_close(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_DIR", str(tmp_path / "d"))
    act = st.offload_activations(host_budget_bytes=0, min_bytes=4096)
    same(train(act, steps=1), train(None, steps=1))
    act.close()
    act.close()
    assert act.closed
    with pytest.raises(RuntimeError, match="closed"):
        with act:
            pass
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("kw, exc, word", [
    (dict(host_budget_bytes=-1), ValueError, "host_budget_bytes"),
    (dict(host_budget_bytes="lots"), ValueError, "host_budget_bytes"),
    (dict(host_budget_bytes=1.5), TypeError, "host_budget_bytes"),
    (dict(min_bytes=0), ValueError, "min_bytes"),
    (dict(min_bytes=None), TypeError, "min_bytes"),
    (dict(prefetch="x"), ValueError, "prefetch"),
    (dict(write_window_bytes=0), ValueError, "write_window_bytes"),
    (dict(key_prefix=""), ValueError, "key_prefix"),
    (dict(key_prefix=3), TypeError, "key_prefix"),
    (dict(path=3), TypeError, "path"),
    (dict(release_memory=1), TypeError, "release_memory"),
])
def test_bad_arguments(act_store, kw, exc, word):
    with pytest.raises(exc, match=word):
        st.offload_activations(act_store if "path" not in kw else None, **kw)


def test_bad_store_and_nesting(act_store, tmp_path):
    with pytest.raises(TypeError, match="store"):
        st.offload_activations("dir")
    with pytest.raises(ValueError, match="store or path"):
        st.offload_activations(act_store, path=str(tmp_path))
    act = make(act_store)
    with act:
        with pytest.raises(RuntimeError, match="nest"):
            act.__enter__()
        with pytest.raises(RuntimeError, match="inside"):
            act.close()
    act.close()


def test_one_shot_block_lives_with_its_graph(tmp_path, monkeypatch):
    """``with offload_activations():`` with no name bound: the graph's handles keep the
    offload alive for the backward after the block; once the graph is gone it is closed
    and its temporary store removed."""
    import gc
    import weakref
    monkeypatch.setenv("STRATA_DIR", str(tmp_path / "d"))
    w = torch.randn(H, H, requires_grad=True)
    x = torch.randn(B, H)
    with st.offload_activations(host_budget_bytes=0, min_bytes=4096) as act:
        y = torch.tanh(x @ w).sum()
    ref = weakref.ref(act)
    del act
    gc.collect()
    assert ref() is not None  # held by y's graph
    y.backward()
    w2 = w.detach().clone().requires_grad_()
    torch.tanh(x @ w2).sum().backward()
    assert torch.equal(w.grad, w2.grad)
    del y
    gc.collect()
    assert ref() is None and list((tmp_path / "d").iterdir()) == []


def test_blocks_leave_the_saved_stack_empty(act_store, tmp_path):
    """Every block pops what it pushed on strata.torch._saved's stack (it grew by one stale
    pack per block: a new bound method never matched by identity), so after an inner
    offload's block the outer one gets parameter offload's tensors again."""
    from strata.torch import _saved
    torch.manual_seed(0)
    m = torch.nn.Linear(H, H)
    handle = st.offload_parameters(m, path=str(tmp_path / "params"), working_set="64KiB")
    outer, inner = make(act_store, key_prefix="outer/"), make(act_store, key_prefix="inner/")
    x = torch.randn(B, H)
    with outer:
        with inner:
            pass
        y = m(x).sum()  # the linear's input goes to parameter offload's hooks, then outer
    assert _saved._STACK == []
    assert outer.stats()["tensors_packed"] == 1 and inner.stats()["tensors_packed"] == 0
    y.backward()
    g = m.weight.grad.clone()
    m.weight.grad = None
    m(x).sum().backward()
    assert torch.equal(g, m.weight.grad)
    for _ in range(3):
        with pytest.raises(KeyError):
            with outer:
                raise KeyError("x")
    assert _saved._STACK == []
    handle.close()
    outer.close()
    inner.close()


def test_path_store_accepts_pathlike_and_deletes_left_overs(tmp_path):
    import numpy as np
    d = tmp_path / "store"
    s = strata.Store.open(str(d))
    s.put("activations/999", np.zeros(10, np.uint8), "nvme")
    s.put("other", np.zeros(3, np.uint8), "nvme")
    s.close()
    act = st.offload_activations(path=d, host_budget_bytes=0, min_bytes=4096)
    assert sorted(act.store.keys("")) == ["other"]
    same(train(act, steps=1), train(None, steps=1))
    act.close()


@pytest.mark.parametrize("budget, view", [(0, False), (0, True), ("1GiB", True)])
def test_in_place_change_of_a_copied_or_written_tensor_raises(act_store, budget, view):
    """torch does not check the version of a hooked saved tensor: a change in place after
    the save of a copied entry (a small view), or of one whose spill was already written,
    ran backward on the old bytes without a word (torch in memory raises)."""
    w = torch.randn(H, H, requires_grad=True)
    x = torch.randn(B, H)
    act = make(act_store, host_budget_bytes=budget)
    with act:
        h = x @ w
        v = h[:8] if view else h  # 8 of 64 rows: copied alone
        y = v.sin().sum()
    act.wait_spills()
    v.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    act.close()


def test_batch_sizes_taking_turns_keep_their_traces(act_store):
    """Two batch sizes alternating: each signature keeps its own trace (one trace for the
    last signature only never prefetched: every backward was a mismatch)."""
    torch.manual_seed(0)
    m = Net()
    torch.manual_seed(0)
    m2 = Net()
    act = make(act_store, host_budget_bytes=2 * ACT)  # backward's first entries in the pool
    g = torch.Generator().manual_seed(3)
    for i in range(6):
        x = torch.randn(B + (i % 2) * 8, D, generator=g)
        with act:
            loss = m(x)
        act.wait_spills()
        loss.backward()
        m2(x).backward()
        if i == 1:
            act.reset_stats()
    s = act.stats()
    assert s["trace_mismatches"] == 0 and s["prefetch_misses"] == 0
    assert s["prefetch_hits"] == s["spills"] > 0
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), m2.parameters()))
    act.close()


def test_a_backward_that_raised_does_not_stop_the_offload(act_store):
    """A backward that raised after an unpack never ran its end callback: the pool stayed
    'in backward' and kept every later saved tensor in memory (nothing offloaded)."""
    act = make(act_store, host_budget_bytes=0)
    w = torch.randn(H, H, requires_grad=True)
    x = torch.randn(B, H)
    with act:
        h = torch.tanh(x @ w)
        h.register_hook(lambda g: (_ for _ in ()).throw(ValueError("boom")))
        y = h.sin().sum()  # sin's backward unpacks h, then h's hook raises
    with pytest.raises(ValueError, match="boom"):
        y.backward()
    del h, y
    act.reset_stats()
    with act:
        y = torch.tanh(x @ w).sum()
    # x (for w's gradient) and tanh's result offloaded; w not saved (x needs no grad)
    assert act.stats()["tensors_packed"] == 2 and act.stats()["tensors_kept"] == 0
    w.grad = None
    y.backward()
    g = w.grad.clone()
    w.grad = None
    torch.tanh(x @ w).sum().backward()
    assert torch.equal(g, w.grad)
    act.close()


def test_backward_after_the_users_store_closed_names_it(act_store):
    act = make(act_store, host_budget_bytes=0)
    w = torch.randn(H, H, requires_grad=True)
    with act:
        y = torch.tanh(torch.randn(B, H) @ w).sum()
    act.wait_spills()
    act_store.close()
    with pytest.raises(RuntimeError, match="the store was closed while a graph"):
        y.backward()
    act.close()
