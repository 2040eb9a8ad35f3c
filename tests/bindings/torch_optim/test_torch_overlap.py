"""overlap_backward=True (strata/torch/optim/_overlap.py): updates started during backward give
bit-identical results to the ordinary step and to torch.optim.AdamW, with clipping, a
skipped step, gradient accumulation, several param groups, frozen parameters, edited
gradients and hyperparameters changed between backward and step, on every tier."""
import math

import pytest
import torch

import strata.torch as st

TIERS = ["nvme", "host", "auto"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8))


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
            for _ in range(n)]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def strata_opt(model_or_groups, tmp_path, name, overlap, tier="nvme", cls=st.OffloadAdamW,
               **kw):
    params = model_or_groups.parameters() if isinstance(model_or_groups, torch.nn.Module) \
        else model_or_groups
    return cls(params, lr=1e-2, path=str(tmp_path / name), tier=tier, arithmetic="torch",
               overlap_backward=overlap, overlap_bucket_numel=3000, host_budget=20000, **kw)


def same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("kind", [(st.OffloadAdamW, torch.optim.AdamW, {}),
                                  (st.OffloadAdam, torch.optim.Adam,
                                   {"weight_decay": 0.01, "amsgrad": True})],
                         ids=["adamw", "adam-l2-amsgrad"])
@pytest.mark.parametrize("tier", TIERS)
def test_matches_torch_and_the_ordinary_step(tmp_path, tier, kind):
    ours, theirs, kw = kind
    ref, seq, ovl = make_model(), make_model(), make_model()
    topt = theirs(ref.parameters(), lr=1e-2, **kw)
    sopt = strata_opt(seq, tmp_path, "seq", False, tier, cls=ours, **kw)
    oopt = strata_opt(ovl, tmp_path, "ovl", True, tier, cls=ours, **kw)
    for x, y in batches(5):
        for m, o in ((ref, topt), (seq, sopt), (ovl, oopt)):
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
        assert same_params(ref, ovl)
        assert same_params(seq, ovl)
        early = oopt.last_step["tensors_started_early"]
        if tier == "nvme":
            assert early == 6 and not oopt.last_step["rolled_back"]
        elif tier == "host":
            assert early == 0  # host-tier state is updated at step()
        assert oopt.last_step["tensors_updated"] == 6
        assert oopt.last_step["exposed_seconds"] >= 0.0
    for name in ("exp_avg", "exp_avg_sq"):
        a, b = sopt.state_dict()["state"], oopt.state_dict()["state"]
        assert all(torch.equal(a[i][name], b[i][name]) for i in a)
    sopt.close()
    oopt.close()


@pytest.mark.parametrize("max_norm", [1e6, 0.05])  # never / always triggered
def test_clipping_is_exact(tmp_path, max_norm):
    seq, ovl = make_model(), make_model()
    sopt = strata_opt(seq, tmp_path, "seq", False, max_grad_norm=max_norm)
    oopt = strata_opt(ovl, tmp_path, "ovl", True, max_grad_norm=max_norm)
    for i, (x, y) in enumerate(batches(4)):
        for m, o in ((seq, sopt), (ovl, oopt)):
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
        assert same_params(seq, ovl)
        # Clipped: the first step's speculation is rolled back, then none is tried
        # while the steps stay clipped.
        assert oopt.last_step["rolled_back"] == (max_norm < 1 and i == 0)
        assert (oopt.last_step["tensors_started_early"] > 0) == (max_norm > 1 or i == 0)
        assert oopt.last_step["clip_coef"] == sopt.last_step["clip_coef"]
    assert sopt.last_step["clip_coef"] < 1 if max_norm < 1 else sopt.last_step["clip_coef"] == 1


def test_non_finite_gradient_skips_the_step(tmp_path):
    seq, ovl = make_model(), make_model()
    sopt = strata_opt(seq, tmp_path, "seq", False)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    data = batches(3)
    for i, (x, y) in enumerate(data):
        for m, o in ((seq, sopt), (ovl, oopt)):
            o.zero_grad()
            loss = loss_of(m, x, y)
            if i == 1:
                loss = loss * float("inf")
            loss.backward()
            o.step()
        assert same_params(seq, ovl)
        # the skipped step's speculation was rolled back; the next one tries none
        assert oopt.last_step["rolled_back"] == (i == 1)
        assert (oopt.last_step["tensors_started_early"] > 0) == (i == 0)
    assert oopt.state_dict()["state"][0]["step"].item() == 2.0  # one step skipped


@pytest.mark.parametrize("use_context", [True, False])
def test_gradient_accumulation(tmp_path, use_context):
    ref, ovl = make_model(), make_model()
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    data = batches(8)
    for k in range(0, 8, 4):
        for m, o in ((ref, topt), (ovl, oopt)):
            o.zero_grad()
            for j, (x, y) in enumerate(data[k:k + 4]):
                if use_context and j < 3 and o is oopt:
                    with oopt.accumulating():
                        loss_of(m, x, y).backward()
                else:
                    loss_of(m, x, y).backward()
            o.step()
        assert same_params(ref, ovl)
        assert oopt.last_step["tensors_started_early"] == 6


def test_param_groups_frozen_params_and_late_scheduler(tmp_path):
    ref, ovl = make_model(), make_model()
    for m in (ref, ovl):
        m[2].weight.requires_grad_(False)  # frozen

    def groups(m):
        return [{"params": [m[0].weight, m[0].bias], "lr": 3e-2},
                {"params": [m[2].weight, m[2].bias, m[4].weight, m[4].bias],
                 "weight_decay": 0.1}]
    topt = torch.optim.AdamW(groups(ref), lr=1e-2)
    oopt = strata_opt(groups(ovl), tmp_path, "ovl", True)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.5)
    osched = torch.optim.lr_scheduler.StepLR(oopt, step_size=1, gamma=0.5)
    frozen = ovl[2].weight.detach().clone()
    for i, (x, y) in enumerate(batches(4)):
        for m, o, sched in ((ref, topt, tsched), (ovl, oopt, osched)):
            o.zero_grad()
            loss_of(m, x, y).backward()
            if i == 2:
                sched.step()  # between backward and step: the early updates are redone
            o.step()
            if i != 2:
                sched.step()
        assert same_params(ref, ovl)
        if i != 2:  # at i == 2 a batch that had not run yet takes the new lr: no redo
            assert not oopt.last_step["rolled_back"]
    assert torch.equal(ovl[2].weight, frozen)


EDITS = {
    "mul_": lambda m: m[4].weight.grad.mul_(0.25),  # a hand-written unscale
    # through .data, which bumps no version counter: caught by the gradient fingerprints
    "data.div_": lambda m: m[0].weight.grad.data.div_(3.0),
    "clip_grad_value_": lambda m: torch.nn.utils.clip_grad_value_(m.parameters(), 1e-3),
    "data =": lambda m: setattr(m[2].bias.grad, "data", m[2].bias.grad.data * 2),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_gradients_edited_after_backward_are_used(tmp_path, edit):
    ref, ovl = make_model(), make_model()
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    for x, y in batches(3):
        for m, o in ((ref, topt), (ovl, oopt)):
            o.zero_grad()
            loss_of(m, x, y).backward()
            EDITS[edit](m)
            o.step()
        assert same_params(ref, ovl)  # (an early batch that ran after the edit needs no redo)


def test_state_dict_between_backward_and_step_sees_the_last_step(tmp_path):
    seq, ovl = make_model(), make_model()
    sopt = strata_opt(seq, tmp_path, "seq", False)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    (x, y), (x2, y2) = batches(2)
    for m, o in ((seq, sopt), (ovl, oopt)):
        o.zero_grad()
        loss_of(m, x, y).backward()
        o.step()
        o.zero_grad()
        loss_of(m, x2, y2).backward()
    a, b = sopt.state_dict(), oopt.state_dict()  # before the second step
    assert all(torch.equal(a["state"][i]["exp_avg"], b["state"][i]["exp_avg"])
               for i in a["state"])
    assert all(b["state"][i]["step"].item() == 1.0 for i in b["state"])
    sopt.step()
    oopt.step()
    assert same_params(seq, ovl)
    oopt.checkpoint()
    oopt.close()


def test_closure_step_is_exact(tmp_path):
    ref, ovl = make_model(), make_model()
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    for x, y in batches(3):
        for m, o in ((ref, topt), (ovl, oopt)):
            def closure(m=m, o=o):
                o.zero_grad()
                loss = loss_of(m, x, y)
                loss.backward()
                return loss
            loss = o.step(closure)
            assert math.isfinite(loss.item())
        assert same_params(ref, ovl)


def test_channels_last_gradients_edited_through_data(tmp_path):
    # conv gradients of a channels_last model are not contiguous: strata reads a copy
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    ovl = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    ovl.load_state_dict(ref.state_dict())
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    oopt = strata_opt(ovl, tmp_path, "ovl", True)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last)
        for m, o in ((ref, topt), (ovl, oopt)):
            o.zero_grad()
            m(x).square().sum().backward()
            torch.nn.utils.clip_grad_value_(m.parameters(), 1e-2)  # p.grad.data.clamp_()
            o.step()
        assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), ovl.parameters()))
