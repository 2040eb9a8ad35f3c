"""The gradient of an offloaded parameter a strata optimizer holds, at the two ends of its
life that torch users reach without thinking of the store: ``del p.grad`` (torch's
``p.grad = None``) and closing the offload between micro-batches (``p.grad`` keeps the sum,
as with torch.optim). Every case is compared with torch.optim on a copy of the model,
``torch.equal`` after the step; with and without gradients held in host memory."""

import pytest
import torch

import strata.torch as st
from strata.torch.optim import OffloadOptimizer

BUDGETS = [0, "1MiB"]  # every gradient in the store; every gradient held in host memory


def _pair(tmp_path, budget, kind):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model.load_state_dict(ref.state_dict())
    h = st.offload_parameters(model, path=str(tmp_path / "p"), working_set=4096,
                              grad_host_budget=budget)
    if kind == "sgd":
        opt = OffloadOptimizer(torch.optim.SGD, model.parameters(), lr=0.1, momentum=0.9,
                               path=str(tmp_path / "o"))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = st.OffloadAdamW(model.parameters(), lr=0.1, path=str(tmp_path / "o"),
                              arithmetic="torch")
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    return ref, model, h, opt, ref_opt  # (the optimizer's own store: it outlives h.close())


def _values(h, model):
    return [h.read(p) if not h.closed else p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_del_grad_drops_the_stored_gradient(tmp_path, budget, kind):
    ref, model, h, opt, ref_opt = _pair(tmp_path, budget, kind)
    x0, x1 = torch.randn(5, 4), torch.randn(5, 4)
    for m in (ref, model):
        m(x0).sum().backward()
        del m[2].bias.grad  # as p.grad = None
        del m[0].weight.grad
    assert model[2].bias.grad is None and model[0].weight.grad is None
    for m in (ref, model):
        m(x1).sum().backward()
    assert torch.equal(model[2].bias.grad, ref[2].bias.grad)  # the second micro-batch only
    ref_opt.step()
    opt.step()
    for a, b in zip(_values(h, model), ref.parameters()):
        assert torch.equal(a, b)
    opt.close()
    h.close()


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_closing_the_offload_between_micro_batches_keeps_the_sum_in_p_grad(
        tmp_path, budget, kind):
    ref, model, h, opt, ref_opt = _pair(tmp_path, budget, kind)
    x0, x1, x2 = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    for m in (ref, model):
        m(x0).sum().backward()
    ref_opt.step()
    opt.step()
    ref_opt.zero_grad()
    opt.zero_grad()
    for m in (ref, model):
        m(x1).sum().backward()
    h.close()  # between micro-batches: the parameters and their gradients back in memory
    for a, b in zip(model.parameters(), ref.parameters()):
        assert type(a) is torch.nn.Parameter
        assert torch.equal(a.grad, b.grad)
    for m in (ref, model):
        m(x2).sum().backward()
    ref_opt.step()
    opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    opt.close()


def test_closing_without_restore_drops_the_gradients(tmp_path):
    ref, model, h, opt, ref_opt = _pair(tmp_path, 0, "sgd")
    model(torch.randn(5, 4)).sum().backward()
    opt.close()
    h.close(restore=False)
    assert all(p.grad is None for p in model.parameters())
