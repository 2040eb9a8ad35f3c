"""Clipping with arithmetic="torch" on every path of the offloaded optimizers, bit for bit
against torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW: by hand in the training loop
(the loop unchanged) and inside strata's step (max_grad_norm=: clip_grad_norm_ over the
optimizer's parameters in param_groups order), with weight-decay groups that list the
parameters in another order than the model, ordinary and overlapped, nvme and host tiers.
Offloaded parameters: tests/bindings/torch_offload/test_param_offload_grads.py."""

import pytest
import torch

import strata.torch as st

TIERS = ["nvme", "host"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 8))


def groups(model):
    """Decay / no-decay groups (as train_lm.py's): biases and LayerNorm weights last."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g) * 4, torch.randn(16, 8, generator=g))
            for _ in range(n)]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


@pytest.mark.parametrize("overlap", [False, True], ids=["ordinary", "overlap"])
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("max_norm", [0.05, 1e6], ids=["clipped", "not-clipped"])
def test_clip_grad_norm_by_hand(tmp_path, tier, overlap, max_norm):
    ref, model = make_model(), make_model()
    topt = torch.optim.AdamW(groups(ref), lr=1e-2)
    sopt = st.OffloadAdamW(groups(model), lr=1e-2, path=str(tmp_path / "s"), tier=tier,
                           arithmetic="torch", overlap_backward=overlap)
    redone = []
    for x, y in batches(5):
        norms = []
        for m, o in ((ref, topt), (model, sopt)):
            o.zero_grad()
            loss_of(m, x, y).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm))
            o.step()
        assert torch.equal(norms[0], norms[1])
        assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters()))
        redone.append(sopt.last_step.get("rolled_back", False))
    if overlap and tier == "nvme" and max_norm > 1:
        # a clip_grad_norm_ that does not clip (factor 1.0) keeps the early updates
        assert redone == [False] * 5
    sopt.close()


@pytest.mark.parametrize("overlap", [False, True], ids=["ordinary", "overlap"])
@pytest.mark.parametrize("tier", TIERS)
def test_max_grad_norm_is_clip_grad_norm_over_the_optimizer_order(tmp_path, tier, overlap):
    ref, model = make_model(), make_model()
    topt = torch.optim.AdamW(groups(ref), lr=1e-2)
    sopt = st.OffloadAdamW(groups(model), lr=1e-2, path=str(tmp_path / "s"), tier=tier,
                           arithmetic="torch", overlap_backward=overlap, max_grad_norm=0.05)
    for x, y in batches(5):
        topt.zero_grad()
        loss_of(ref, x, y).backward()
        total = torch.nn.utils.clip_grad_norm_(
            [p for g in topt.param_groups for p in g["params"]], 0.05)
        topt.step()
        sopt.zero_grad()
        loss_of(model, x, y).backward()
        sopt.step()
        assert sopt.last_step["grad_norm"] == float(total)
        assert sopt.last_step["clip_coef"] < 1.0
        assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters()))
    sopt.close()


def test_a_nonfinite_gradient_skips_the_step_with_a_warning(tmp_path):
    """strata skips a step whose gradients hold inf/NaN (torch.optim would write NaN into
    the parameters): not silently -- a RuntimeWarning and last_step["skipped"]."""
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, path=str(tmp_path / "s"),
                          arithmetic="torch")
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    model[0].weight.grad[0, 0] = float("nan")
    with pytest.warns(RuntimeWarning, match=r"skipped, a gradient holds inf or NaN"):
        opt.step()
    assert opt.last_step["skipped"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.close()
