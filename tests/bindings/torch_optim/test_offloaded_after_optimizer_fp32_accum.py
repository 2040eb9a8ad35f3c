"""bf16 parameters offloaded by ``strata.torch.offload_parameters`` AFTER a strata optimizer
(OffloadAdamW; OffloadOptimizer over torch.optim.SGD with momentum and over AdamW) took them
in memory: their micro-batch gradients are summed in fp32 (the default
``grad_accumulation_dtype``) from the very first micro-batch after the offload, as for
parameters offloaded before the optimizer was made -- the offload tells the optimizers
holding a parameter (strata/torch/_common.py, ``note_holder`` / ``announce_offload``), which
bind it at once. Each case: 3 micro-batches a step, and the parameters after every step
torch.equal to in-memory torch summing each micro-batch's gradient in fp32 by hand, then the
same torch.optim class on fp32 masters (the parameters their masters rounded to bf16).

When the offload comes: right after the optimizer was made; after a step in memory; between
the micro-batches of a step (after the first, and after the second: the optimizer's fp32
sum of the micro-batches so far goes to the store as the offloaded parameter's sum).
Also: an optimizer closed before the offload binds nothing (its gradients stay in
``p.grad``, as torch leaves them).
"""
import pytest
import torch
import torch.nn.functional as F

import strata.torch as st
from strata.torch.optim import OffloadOptimizer

BF16 = torch.bfloat16
STEPS, MICRO = 3, 3
WORKING_SET = 4096  # bytes: less than the model (parameters fetched and released)

KINDS = {
    "OffloadAdamW": (
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps, d: st.OffloadAdamW(ps, lr=1e-2, weight_decay=0.1, path=d,
                                      arithmetic="torch")),
    "OffloadOptimizer-SGD": (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda ps, d: OffloadOptimizer(torch.optim.SGD, ps, lr=0.1, momentum=0.9,
                                       weight_decay=0.01, path=d)),
    "OffloadOptimizer-AdamW": (
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps, d: OffloadOptimizer(torch.optim.AdamW, ps, lr=1e-2, weight_decay=0.1,
                                       path=d)),
}
#: when the model is offloaded: (step, micro-batches of that step run before), or "made"
WHEN = {"made": None, "after-a-step": (1, 0), "after-1-micro-batch": (0, 1),
        "after-2-micro-batches": (1, 2)}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 5)).to(BF16)


def _data():
    g = torch.Generator().manual_seed(1)
    return [[(torch.randn(16, 32, generator=g), torch.randint(0, 5, (16,), generator=g))
             for _ in range(MICRO)] for _ in range(STEPS)]


def _loss(model, x, y):
    return F.cross_entropy(model(x.to(BF16)).float(), y)


def _reference(make_opt, fp32_sums=True):
    """torch by hand: each micro-batch's bf16 gradient widened and summed in fp32 (or, with
    ``fp32_sums`` False, torch's own accumulation in bf16, widened), ``make_opt(masters)``
    stepping fp32 masters on the sums, the parameters the masters rounded (nearest even).
    Returns the parameters after each step."""
    ref = _model()
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    opt = make_opt(masters)
    out = []
    for mb in _data():
        sums = None
        for p in ref.parameters():
            p.grad = None
        for x, y in mb:
            if fp32_sums:
                for p in ref.parameters():
                    p.grad = None  # this micro-batch's gradient alone
            _loss(ref, x, y).backward()
            if fp32_sums:
                g = [p.grad.float() for p in ref.parameters()]
                sums = g if sums is None else [a + b for a, b in zip(sums, g)]
        if not fp32_sums:
            sums = [p.grad.float() for p in ref.parameters()]
        for m, t in zip(masters, sums):
            m.grad = t
        opt.step()
        with torch.no_grad():
            for p, m in zip(ref.parameters(), masters):
                p.copy_(m)
        out.append([p.detach().clone() for p in ref.parameters()])
    return out


def _values(model, h):
    return [h.read(p) if h is not None else p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("when", sorted(WHEN))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_offloaded_after_the_optimizer_sums_in_fp32_from_the_first_micro_batch(
        kind, when, tmp_path):
    ref_opt, make = KINDS[kind]
    want = _reference(ref_opt)
    bf16 = _reference(ref_opt, fp32_sums=False)
    assert any(not torch.equal(a, b) for a, b in zip(want[0], bf16[0])), \
        "the data must tell fp32 sums from bf16 ones in the first step"
    model = _model()
    opt = make(model.parameters(), str(tmp_path / "optim"))
    at = WHEN[when]
    h = None
    if at is None:
        h = st.offload_parameters(model, path=str(tmp_path / "params"),
                                  working_set=WORKING_SET)
    for s, mb in enumerate(_data()):
        opt.zero_grad(set_to_none=True)
        for k, (x, y) in enumerate(mb):
            if at == (s, k):
                h = st.offload_parameters(model, path=str(tmp_path / "params"),
                                          working_set=WORKING_SET)
            _loss(model, x, y).backward()
        opt.step()
        for i, (a, b) in enumerate(zip(_values(model, h), want[s])):
            assert torch.equal(a, b), (s, i)
    assert h.stats()["grad_bytes_read"] > 0  # the gradients went through the store
    opt.close()
    h.close()


def test_a_closed_optimizer_binds_nothing(tmp_path):
    """An optimizer closed before the offload is not told of it: the gradients stay in
    ``p.grad`` (torch's own accumulation, in bf16)."""
    model = _model()
    opt = st.OffloadAdamW(model.parameters(), path=str(tmp_path / "optim"))
    opt.close()
    h = st.offload_parameters(model, path=str(tmp_path / "params"), working_set=WORKING_SET)
    x, y = _data()[0][0]
    _loss(model, x, y).backward()
    assert h.stats()["grad_bytes_written"] == 0
    assert all(p.grad is not None and p.grad.dtype == BF16 for p in model.parameters())
    h.close()
