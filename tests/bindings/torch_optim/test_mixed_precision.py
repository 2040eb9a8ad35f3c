"""Mixed precision in strata's optimizers (optim/_grad_accum.py, OffloadOptimizer over
fp16/bf16 parameters; docs/guide-optimizers.md "Mixed precision"):

* fp32 gradient accumulation (the default for fp16/bf16 parameters): a training of 4
  micro-batches per step is bit-identical to in-memory torch doing it by hand (``sum = g``,
  then ``sum = sum + g.float()`` in the same order, AdamW on fp32 masters, the parameter
  the master rounded to nearest even); ``p.grad`` shows the sum rounded to the parameter's
  dtype; nvme and host tiers; fp16 under DynamicLossScaler (an overflow injected);
* ``grad_accumulation_dtype="param"``: identical to torch's own accumulation;
* ``p.grad`` edited (``mul_``, ``zero_grad(set_to_none=False)``): the step takes it;
* OffloadOptimizer over bf16/fp16 parameters (SGD-momentum, Adagrad, RMSprop, AdamW)
  bit-identical to the class in memory on fp32 masters by hand;
* refused options."""
import pytest
import torch
import torch.nn.functional as F

import strata.torch as st
from strata.torch.optim import DynamicLossScaler, OffloadOptimizer

TIERS = ["nvme", "host"]
MICRO = 4
STEPS = 3


class Net(torch.nn.Module):
    """Parameters in ``dtype``; fp16 arithmetic in fp32 (not on torch 1.13's CPU): fp16
    parameters get fp16 gradients (the cast's backward)."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.to(dtype)
        self.dtype = dtype

    def forward(self, x):
        x = x.to(self.dtype) if self.dtype == torch.bfloat16 else x
        if self.dtype != torch.float16:
            return self.l2(torch.tanh(self.l1(x))).float()
        h = torch.tanh(F.linear(x, self.l1.weight.float(), self.l1.bias.float()))
        return F.linear(h, self.l2.weight.float(), self.l2.bias.float())


def _batches(steps=STEPS, inf_at=None):
    g = torch.Generator().manual_seed(1)
    out = []
    for s in range(steps):
        mb = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g))
              for _ in range(MICRO)]
        if s == inf_at:
            mb[2][0][0, 3] = float("inf")
        out.append(mb)
    return out


def _same(a, b):
    """torch.equal, NaN equal to NaN (an overflowing step's gradients)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def _reference(dtype, make_opt, fp32_sum=True, scales=None, inf_at=None, edit=None):
    """torch by hand: fp32 masters stepped by ``make_opt(masters)``, micro-batch gradients
    summed in fp32 (or by torch in the parameter's dtype), the parameters the masters
    rounded; (params, masters, sums) after each step."""
    ref = Net(dtype)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    topt = make_opt(masters)
    out = []
    for s, mb in enumerate(_batches(inf_at=inf_at)):
        scale = scales[s] if scales else 1.0
        sums = [None] * len(masters)
        for p in ref.parameters():
            p.grad = None
        for x, y in mb:
            if fp32_sum:
                for p in ref.parameters():
                    p.grad = None  # this micro-batch's gradient alone
            (F.mse_loss(ref(x), y) * scale).backward()
            if fp32_sum:
                sums = [p.grad.float() if t is None else t + p.grad.float()
                        for p, t in zip(ref.parameters(), sums)]
        if not fp32_sum:
            sums = [p.grad.float() for p in ref.parameters()]
        taken = sums if edit is None else [edit(t.to(dtype)).float() for t in sums]
        grads = [t / scale for t in taken]
        if all(bool(torch.isfinite(g).all()) for g in grads):
            for m, g in zip(masters, grads):
                m.grad = g
            topt.step()
            with torch.no_grad():
                for p, m in zip(ref.parameters(), masters):
                    p.copy_(m)  # round to nearest even, as strata's parameter copy
        out.append(([p.detach().clone() for p in ref.parameters()],
                    [m.detach().clone() for m in masters], sums))
    return out


def _train(dtype, opt_of, want, scaler=None, inf_at=None, edit=None, fp32_sum=True):
    model = Net(dtype)
    opt = opt_of(model)
    for s, mb in enumerate(_batches(inf_at=inf_at)):
        opt.zero_grad(set_to_none=True)
        for x, y in mb:
            loss = F.mse_loss(model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
        for p, t in zip(model.parameters(), want[s][2]):  # p.grad: the sum, rounded
            if fp32_sum:
                assert p.grad.dtype == dtype and _same(p.grad, t.to(dtype)), s
        if edit is not None:
            for p in model.parameters():
                edit(p.grad)
        if scaler:
            scaler.step(opt)
            scaler.update()
            assert opt.last_step["skipped"] == (s == inf_at), s
        else:
            opt.step()
        for got, ref in zip(model.parameters(), want[s][0]):
            assert got.dtype == ref.dtype and torch.equal(got.detach(), ref), s
    return model, opt


def _adamw(masters):
    return torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)


def _offload_adamw(tmp_path, tier, **kw):
    return lambda m: st.OffloadAdamW(m.parameters(), lr=1e-2, weight_decay=0.1,
                                     path=str(tmp_path / "s"), tier=tier,
                                     arithmetic="torch", **kw)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_accumulation_equals_torch_by_hand(tmp_path, tier, dtype):
    want = _reference(dtype, _adamw)
    other = _reference(dtype, _adamw, fp32_sum=False)
    assert any(not torch.equal(a, b) for a, b in zip(want[-1][0], other[-1][0])), \
        "the data must tell fp32 accumulation from torch's"
    model, opt = _train(dtype, _offload_adamw(tmp_path, tier), want)
    sd = opt.state_dict()["state"]
    for i, m in enumerate(want[-1][1]):
        assert torch.equal(sd[i]["master_param"].view(m.shape), m), i
    opt.close()


@pytest.mark.parametrize("tier", TIERS)
def test_param_dtype_option_equals_torch_accumulation(tmp_path, tier):
    want = _reference(torch.bfloat16, _adamw, fp32_sum=False)
    _, opt = _train(torch.bfloat16, _offload_adamw(tmp_path, tier,
                                                   grad_accumulation_dtype="param"),
                    want, fp32_sum=False)
    opt.close()


@pytest.mark.parametrize("tier", TIERS)
def test_fp16_under_the_loss_scaler_with_an_overflow(tmp_path, tier):
    # init 1024, window 2, hysteresis 2: step 1 overflows (uses up the hysteresis), no
    # growth before step 4: every step's scale is 1024 (by hand from DeepSpeed's rule)
    want = _reference(torch.float16, _adamw, scales=[1024.0] * STEPS, inf_at=1)
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2)
    _, opt = _train(torch.float16, _offload_adamw(tmp_path, tier), want, scaler=scaler,
                    inf_at=1)
    assert scaler.get_scale() == 1024.0 and scaler.overflows == 1
    opt.close()


def test_an_edited_grad_is_what_the_step_takes(tmp_path):
    edit = lambda g: g.mul_(0.5)  # noqa: E731 (as clip_grad_norm_'s rescale)
    want = _reference(torch.bfloat16, _adamw, edit=edit)
    _, opt = _train(torch.bfloat16, _offload_adamw(tmp_path, "host"), want, edit=edit)
    opt.close()


def test_zeroed_grad_restarts_the_sum_and_p_grad_stays_coherent(tmp_path):
    model = Net(torch.bfloat16)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, path=str(tmp_path / "s"), tier="host")
    (x1, y1), (x2, y2), (x3, y3) = _batches(1)[0][:3]
    F.mse_loss(model(x1), y1).backward()
    held = model.l1.weight.grad  # torch keeps p.grad's identity over accumulations
    opt.zero_grad(set_to_none=False)
    assert torch.equal(held, torch.zeros_like(held))
    F.mse_loss(model(x2), y2).backward()
    F.mse_loss(model(x3), y3).backward()
    assert model.l1.weight.grad is held
    ref = Net(torch.bfloat16)
    gs = []
    for x, y in ((x2, y2), (x3, y3)):
        ref.zero_grad(set_to_none=True)
        F.mse_loss(ref(x), y).backward()
        gs.append(ref.l1.weight.grad.float())
    want = (torch.zeros_like(gs[0]) + gs[0]) + gs[1]
    assert torch.equal(held, want.to(torch.bfloat16))
    assert torch.equal(opt._accum.grad(model.l1.weight), want)
    opt.close()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls, kw", [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (torch.optim.Adagrad, dict(lr=0.05)),
    (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
], ids=["SGD-momentum", "Adagrad", "RMSprop", "AdamW"])
def test_offload_optimizer_over_low_precision_params(tmp_path, tier, dtype, cls, kw):
    want = _reference(dtype, lambda m: cls(m, **kw))
    _, opt = _train(dtype, lambda m: OffloadOptimizer(cls, m.parameters(), path=str(
        tmp_path / "s"), tier=tier, **kw), want)
    # a checkpoint and resume keeps the fp32 masters (not the rounded parameters)
    opt.checkpoint()
    opt.close()


def test_offload_optimizer_resume_keeps_the_masters(tmp_path):
    kw = dict(lr=0.05, momentum=0.9)
    want = _reference(torch.bfloat16, lambda m: torch.optim.SGD(m, **kw))
    model, opt = _train(torch.bfloat16, lambda m: OffloadOptimizer(
        torch.optim.SGD, m.parameters(), path=str(tmp_path / "s"), **kw), want)
    opt.close()
    fresh = Net(torch.bfloat16)
    opt = OffloadOptimizer(torch.optim.SGD, fresh.parameters(), path=str(tmp_path / "s"),
                           resume=True, **kw)
    for p, ref, m in zip(fresh.parameters(), want[-1][0], want[-1][1]):
        assert torch.equal(p.detach(), ref)
        h = opt._handle[id(p)]
        assert torch.equal(torch.from_numpy(opt._core.read_param(h)).view(m.shape), m)
    opt.close()


def test_offload_optimizer_param_option(tmp_path):
    kw = dict(lr=0.05, momentum=0.9)
    want = _reference(torch.bfloat16, lambda m: torch.optim.SGD(m, **kw), fp32_sum=False)
    _, opt = _train(torch.bfloat16, lambda m: OffloadOptimizer(
        torch.optim.SGD, m.parameters(), path=str(tmp_path / "s"), tier="host",
        grad_accumulation_dtype="param", **kw), want, fp32_sum=False)
    opt.close()


def test_refused_options(tmp_path):
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    for bad in (torch.float64, torch.bfloat16, "fp32", 4):
        with pytest.raises(ValueError, match="grad_accumulation_dtype"):
            st.OffloadAdamW([p], path=str(tmp_path / "a"), grad_accumulation_dtype=bad)
        with pytest.raises(ValueError, match="grad_accumulation_dtype"):
            OffloadOptimizer(torch.optim.SGD, [p], lr=0.1, path=str(tmp_path / "b"),
                             grad_accumulation_dtype=bad)
    with pytest.raises(ValueError, match="overlap_backward"):
        st.OffloadAdamW([p], path=str(tmp_path / "c"), overlap_backward=True,
                        grad_accumulation_dtype=torch.float32)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        OffloadOptimizer(torch.optim.SGD, [torch.nn.Parameter(torch.zeros(2).double())],
                         lr=0.1, path=str(tmp_path / "d"))
