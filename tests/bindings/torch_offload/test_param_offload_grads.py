"""Code that touches gradients or parameters between backward and step, on offloaded
parameters (strata.torch.offload_parameters + OffloadAdamW): every idiom compared bit for
bit with the same training in memory (torch.optim.AdamW), on the nvme and host tiers, with a
working set small enough that materialized gradients are stored back and released.
"""

import pytest
import torch
import torch.nn as nn

import strata
import strata.torch as st
from test_param_offload import Net, batch, loss_of

TIERS = ["nvme", "host"]


def make_pair(seed=0):
    torch.manual_seed(seed)
    ref = Net()
    model = Net()
    model.load_state_dict(ref.state_dict())
    return ref, model


def assert_same(ref, model, h):
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def run(ref, model, h, between, steps=3, micro=1, lr=1e-2):
    """Trains both models with ``between(model, step)`` called after backward (on each),
    returning what ``between`` returned for each, per step."""
    ropt = torch.optim.AdamW(ref.parameters(), lr=lr)
    opt = st.OffloadAdamW(model.parameters(), lr=lr, store=h.store, arithmetic="torch")
    out = []
    for step in range(steps):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            for k in range(micro):
                loss_of(m, *batch(step, k)).backward()
            r = between(m, step)
            o.step()
            out.append(r)
    opt.close()
    return out[0::2], out[1::2]


@pytest.fixture(params=TIERS)
def setup(request, tmp_path):
    ref, model = make_pair()
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096,
                              tier=request.param)
    yield ref, model, h
    h.close()


def test_clip_grad_norm_by_hand_reads_no_gradient(setup):
    ref, model, h = setup
    reads = []

    def clip(m, step):
        before = h.stats()["grad_bytes_read"] if m is model else 0
        n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        if m is model:
            reads.append(h.stats()["grad_bytes_read"] - before)
        return n
    r, s = run(ref, model, h, clip, steps=4)
    for a, b in zip(r, s):
        assert torch.equal(a, b)  # the returned total norm, bit for bit
    assert reads == [0, 0, 0, 0]  # norms known, the rescale recorded: no I/O
    assert_same(ref, model, h)


def test_clip_grad_value_and_in_place_edits(setup):
    ref, model, h = setup

    def edit(m, step):
        torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)
        m.fc1.weight.grad.mul_(0.5)
        m.fc1.weight.grad[0].zero_()
        m.fc2.bias.grad.add_(torch.full_like(m.fc2.bias, 1e-3))
        m.gate.weight.grad.data.clamp_(-0.004, 0.004)
        m.ln.weight.grad.div_(torch.tensor(3.0))
        m.emb.weight.grad.view(-1)[:5] = 0.25  # through a view
        return (m.fc1.weight.grad.clone(), float(m.fc2.weight.grad.sum()),
                m.emb.weight.grad.abs().max())
    r, s = run(ref, model, h, edit)
    for a, b in zip(r, s):
        assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])
    assert_same(ref, model, h)


def test_grad_none_skips_the_parameter(setup):
    ref, model, h = setup

    def drop(m, step):
        m.fc1.weight.grad = None
        if step == 1:
            m.zero_grad(set_to_none=True)  # nothing stepped at all
        return m.fc1.weight.grad is None
    r, s = run(ref, model, h, drop)
    assert r == s == [True, True, True]
    assert_same(ref, model, h)
    assert torch.equal(h.read(model.fc1.weight), ref.fc1.weight.detach())


def test_assigning_a_gradient(setup):
    ref, model, h = setup

    def assign(m, step):
        g = torch.full_like(m.fc2.weight, 0.01 * (step + 1))
        m.fc2.weight.grad = g
        assert m.fc2.weight.grad is g  # aliased, as in torch
        g.mul_(2.0)
        m.gate.weight.grad = m.gate.weight.grad.clone() * 0.5
        with pytest.raises(RuntimeError):
            m.fc1.bias.grad = torch.zeros(3)  # torch's own check
    run(ref, model, h, assign)
    assert_same(ref, model, h)


def test_accumulation_with_edits_between_micro_batches(setup):
    ref, model, h = setup
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    for step in range(3):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad(set_to_none=False)  # torch 1.13's default: zeros, then += g
            loss_of(m, *batch(step, 0)).backward()
            m.fc1.weight.grad.mul_(0.25)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3)
            loss_of(m, *batch(step, 1)).backward()
            m.fc2.weight.grad.clamp_(-0.01, 0.01)
            o.step()
        assert_same(ref, model, h)
    opt.close()


def test_zero_grad_forms_and_hooks(setup):
    ref, model, h = setup
    for m in (ref, model):
        m.fc1.weight.register_hook(lambda g: g * 2)  # a tensor hook runs before accumulation

    def zero(m, step):
        if step == 1:
            m.zero_grad(set_to_none=False)  # the step runs with zero gradients
            loss_of(m, *batch(50, 0)).backward()
        return m.fc1.weight.grad.clone()
    r, s = run(ref, model, h, zero)
    for a, b in zip(r, s):
        assert torch.equal(a, b)
    assert_same(ref, model, h)


def test_foreach_forms(setup):
    """torch 2.x's clip_grad_norm_ and zero_grad run torch._foreach_* over the gradients."""
    ref, model, h = setup
    if not hasattr(torch, "_foreach_norm"):
        pytest.skip("this torch has no torch._foreach_norm")

    def fe(m, step):
        grads = [p.grad for p in m.parameters() if p.grad is not None]
        norms = torch._foreach_norm(grads, 2)
        total = torch.norm(torch.stack(norms), 2.0)
        coef = torch.clamp(0.3 / (total + 1e-6), max=1.0)
        torch._foreach_mul_(grads, coef)
        torch._foreach_add_(grads, 1e-4)
        return total
    r, s = run(ref, model, h, fe)
    for a, b in zip(r, s):
        assert torch.equal(a, b)
    assert_same(ref, model, h)


def test_hand_written_sgd_reads_the_gradient(setup):
    ref, model, h = setup
    for m in (ref, model):
        loss_of(m, *batch(0, 0)).backward()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store)  # binds the gradients
    loss_of(model, *batch(0, 0)).backward()  # now stored: p.grad is an OffloadedGrad
    model.zero_grad()
    ref.zero_grad()
    for m in (ref, model):
        loss_of(m, *batch(1, 0)).backward()
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)
    assert_same(ref, model, h)
    opt.close()


def test_amp_grad_scaler_unscale(setup):
    ref, model, h = setup
    try:
        scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    except (AttributeError, TypeError, RuntimeError) as e:
        pytest.skip(f"this torch's GradScaler does not run on CPU ({e})")
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    for step in range(3):
        for m, o, sc in ((ref, ropt, scalers[0]), (model, opt, scalers[1])):
            o.zero_grad()
            sc.scale(loss_of(m, *batch(step, 0))).backward()
            sc.unscale_(o)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            sc.step(o)
            sc.update()
    assert_same(ref, model, h)
    opt.close()


@pytest.mark.parametrize("tier", TIERS)
def test_optimizer_built_before_the_offload_follows_it(tmp_path, tier):
    ref, model = make_pair()
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, arithmetic="torch")
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096, tier=tier)
    for step in range(3):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            loss_of(m, *batch(step, 0)).backward()
            o.step()
    assert_same(ref, model, h)
    opt.close()
    h.close()


@pytest.mark.parametrize("shared_store", [False, True])
def test_optimizer_built_before_the_offload_with_overlap_follows_it(tmp_path, shared_store):
    """overlap_backward=True built before the offload: the first step binds the gradients
    (stepped after backward); in the offload's store the parameters are then linked to
    their masters and updated inside backward (optim/_overlap.py)."""
    ref, model = make_pair()
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    store = strata.Store.open(str(tmp_path / "s")) if shared_store else None
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, arithmetic="torch",
                          overlap_backward=True, store=store)
    if shared_store:
        h = st.offload_parameters(model, store, working_set=4096)
    else:
        h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096)
    started = []
    for step in range(3):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            loss_of(m, *batch(step, 0)).backward()
            o.step()
        started.append(opt.last_step.get("tensors_started_early", 0))
        assert_same(ref, model, h)
    assert started == ([0, 8, 8] if shared_store else [0, 0, 0])
    opt.close()
    h.close()
    if store is not None:
        store.close()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("order", ["offload_first", "optimizer_first", "no_optimizer"])
def test_resume_of_parameters_returns_the_stored_values(tmp_path, order, tier):
    ref, model = make_pair()
    path = str(tmp_path / "s")
    store = strata.Store.open(path, durability="flush")
    h = st.offload_parameters(model, store, tier=tier)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store, arithmetic="torch",
                          tier=tier)
    for step in range(2):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            loss_of(m, *batch(step, 0)).backward()
            o.step()
    opt.checkpoint()
    h.checkpoint()
    opt.close()
    h.close(restore=False)
    _, fresh = make_pair(seed=7)  # other values: the stored ones must win
    if order == "optimizer_first":
        opt = st.OffloadAdamW(fresh.parameters(), lr=1e-2, store=store, arithmetic="torch",
                              tier=tier, resume=True)
        h = st.offload_parameters(fresh, store, resume=True, tier=tier)
    else:
        h = st.offload_parameters(fresh, store, resume=True, tier=tier)
        opt = (st.OffloadAdamW(fresh.parameters(), lr=1e-2, store=store, arithmetic="torch",
                               tier=tier, resume=True) if order == "offload_first" else None)
    assert_same(ref, fresh, h)
    if opt is not None:  # training goes on as if never interrupted
        for step in range(2, 4):
            for m, o in ((ref, ropt), (fresh, opt)):
                o.zero_grad()
                loss_of(m, *batch(step, 0)).backward()
                o.step()
        assert_same(ref, fresh, h)
        opt.close()
    h.close()
    store.close()


def test_partitioned_gradient_values_are_refused_clearly(tmp_path):
    """(ZeRO-3's p.grad holds this rank's slice only: reading its values is refused; the
    multi-rank run is in test_param_offload_ranks.py.)"""
    from strata.torch.offload._grad_tensor import make_grad
    _, model = make_pair()
    h = st.offload_parameters(model, path=str(tmp_path / "s"))
    s = h.ws.records[0]
    s.owned, s.has_grad, s.to_store = (0, 1), True, True
    with pytest.raises(RuntimeError, match="partitioned over the ranks"):
        make_grad(s).sum()
    s.owned, s.has_grad = None, False
    h.close()


def test_repr_of_a_stored_gradient_shows_its_values(setup):
    _, model, h = setup
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store)
    model.zero_grad()
    loss_of(model, *batch(0, 0)).backward()
    g = model.fc2.bias.grad
    assert repr(g) == repr(h.grad(model.fc2.bias))  # torch's: tensor([...])
    assert g.is_contiguous() and g.stride() == (1,) and g.shape == model.fc2.bias.shape
    opt.close()


def test_max_grad_norm_of_offloaded_parameters_is_clip_grad_norm_over_the_model(setup):
    """Offloaded parameters' norms are stacked in the model's order (their position in
    ``model.parameters()``), whatever the param_groups' order."""
    ref, model, h = setup

    def split(m):
        decay = [p for p in m.parameters() if p.dim() >= 2 and p.requires_grad]
        rest = [p for p in m.parameters() if p.dim() < 2 and p.requires_grad]
        return [{"params": rest, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.1}]
    ropt = torch.optim.AdamW(split(ref), lr=1e-2)
    opt = st.OffloadAdamW(split(model), lr=1e-2, store=h.store, arithmetic="torch",
                          max_grad_norm=0.05)
    for step in range(3):
        ropt.zero_grad()
        loss_of(ref, *batch(step, 0)).backward()
        total = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ropt.step()
        opt.zero_grad()
        loss_of(model, *batch(step, 0)).backward()
        opt.step()
        assert opt.last_step["grad_norm"] == float(total) and opt.last_step["clip_coef"] < 1
        assert_same(ref, model, h)
    opt.close()


@pytest.mark.parametrize("tier", TIERS)
def test_offload_after_in_memory_steps(tmp_path, tier):
    """A state-only optimizer steps in memory, then the model is offloaded mid-training:
    what the in-memory steps attached to strata's handles is not stepped again."""
    ref, model = make_pair()
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, arithmetic="torch", tier=tier)
    h = None
    for step in range(4):
        if step == 2:
            h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096,
                                      tier=tier)
        for m, o in ((ref, ropt), (model, opt)):
            loss_of(m, *batch(step, 0)).backward()
            o.step()
            o.zero_grad()
    assert_same(ref, model, h)
    opt.close()
    h.close()


def test_closing_the_offload_while_its_optimizer_goes_on(tmp_path):
    ref, model = make_pair()
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, arithmetic="torch")
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096)
    for step in range(4):
        if step == 2:
            h.close()  # the parameters come back in memory; the optimizer goes on
        for m, o in ((ref, ropt), (model, opt)):
            loss_of(m, *batch(step, 0)).backward()
            o.step()
            o.zero_grad()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert type(b) is nn.Parameter and torch.equal(a, b)
    opt.close()


_KILLED_CHILD = """
import os, signal, sys
import torch, strata, strata.torch as st
sys.path.insert(0, {here!r})
from test_param_offload_grads import make_pair, batch, loss_of
_, model = make_pair()
store = strata.Store.open({path!r}, durability="flush")
h = st.offload_parameters(model, store, working_set=4096, tier={tier!r})
opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store, arithmetic="torch", tier={tier!r})
for step in range(3):
    opt.zero_grad()
    loss_of(model, *batch(step, 0)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
opt.checkpoint()
h.checkpoint()
opt.zero_grad()
loss_of(model, *batch(3, 0)).backward()
opt.step()  # not checkpointed: the parameters' objects hold it, the optimizer's state not
store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("order", ["offload_first", "optimizer_first"])
def test_resume_after_a_kill_past_the_checkpoint_in_either_order(tmp_path, tier, order):
    import os
    import subprocess
    import sys
    path = str(tmp_path / "s")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", _KILLED_CHILD.format(here=here, path=path,
                                                                     tier=tier)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]
    ref, _ = make_pair()
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(5):
        ropt.zero_grad()
        loss_of(ref, *batch(step, 0)).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ropt.step()
    _, fresh = make_pair(seed=7)
    store = strata.Store.open(path, durability="flush")
    kw = dict(lr=1e-2, store=store, arithmetic="torch", tier=tier, resume=True)
    if order == "optimizer_first":
        opt = st.OffloadAdamW(fresh.parameters(), **kw)
        h = st.offload_parameters(fresh, store, working_set=4096, tier=tier, resume=True)
    else:
        h = st.offload_parameters(fresh, store, working_set=4096, tier=tier, resume=True)
        opt = st.OffloadAdamW(fresh.parameters(), **kw)
    for step in range(3, 5):  # from the checkpoint (after step 2), not the killed step 3
        opt.zero_grad()
        loss_of(fresh, *batch(step, 0)).backward()
        torch.nn.utils.clip_grad_norm_(fresh.parameters(), 0.5)
        opt.step()
    assert_same(ref, fresh, h)
    opt.close()
    h.close()
    store.close()


def test_resume_argument_errors(tmp_path):
    _, model = make_pair()
    with pytest.raises(ValueError, match="resume=True keeps the stored parameters"):
        st.offload_parameters(model, path=str(tmp_path / "missing"), resume=True,
                              overwrite=True)
    with pytest.raises(ValueError, match="pass the store or the path of the earlier run"):
        st.offload_parameters(model, resume=True)
    assert not (tmp_path / "missing").exists()
