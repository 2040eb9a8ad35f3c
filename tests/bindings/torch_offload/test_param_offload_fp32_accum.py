"""fp32 gradient accumulation of parameters offloaded by strata.torch.offload_parameters
(offload/_grad_sum.py; docs/guide-optimizers.md "Mixed precision: gradient accumulation"):

* bf16/fp16 parameters, 4 micro-batches per step, nvme and host tiers, OffloadAdamW and
  OffloadAdam (amsgrad, clipped by max_grad_norm): the parameters, ``p.grad`` (the fp32 sum
  rounded to the parameter's dtype) and the fp32 masters are bit-identical (torch.equal)
  to in-memory torch summing the micro-batch gradients in fp32 by hand, then the same
  torch.optim class on fp32 masters;
* the gradient object holds the fp32 sum (4 bytes per element; 2 with "param");
* ``grad_accumulation_dtype="param"``: torch's own accumulation in the parameter's dtype;
* edits of ``p.grad`` (``mul_`` between micro-batches, ``clip_grad_norm_``, ``zero_grad``
  without set_to_none): the offloaded model steps exactly as the same optimizer over the
  same model in memory (optim/_grad_accum.py), step by step;
* fp16 under DynamicLossScaler with an overflow injected in one micro-batch: that step
  skipped, the others bit-identical to torch by hand (scaled losses, fp32 sums unscaled).
(OffloadOptimizer over offloaded parameters: tests/bindings/torch_optim/
test_any_optimizer_offloaded.py.)
"""
import pytest
import torch
import torch.nn.functional as F

import strata.torch as st
from strata.torch.optim import DynamicLossScaler

TIERS = ["nvme", "host"]
MICRO = 4
STEPS = 3


class Net(torch.nn.Module):
    """Parameters in ``dtype``; fp16 arithmetic in fp32 (torch 1.13's CPU has no fp16
    matmul): fp16 parameters still get fp16 gradients (the cast's backward)."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.to(dtype)
        self.dtype = dtype

    def forward(self, x):
        if self.dtype == torch.bfloat16:
            return self.l2(torch.tanh(self.l1(x.to(self.dtype)))).float()
        h = torch.tanh(F.linear(x, self.l1.weight.float(), self.l1.bias.float()))
        return F.linear(h, self.l2.weight.float(), self.l2.bias.float())


def _batches(inf_at=None):
    """STEPS steps of MICRO micro-batches (x, y); step ``inf_at``'s third input holds an
    inf."""
    g = torch.Generator().manual_seed(1)
    out = [[(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g))
            for _ in range(MICRO)] for _ in range(STEPS)]
    if inf_at is not None:
        out[inf_at][2][0][0, 3] = float("inf")
    return out


def _reference(dtype, make_opt, fp32_sum=True, max_norm=0.0, scale=1.0, inf_at=None):
    """torch by hand: each micro-batch's gradient (the parameter's dtype, autograd's) summed
    in fp32 (``sum = g.float()``, then ``sum = sum + g.float()``) or by torch in the
    parameter's dtype; ``make_opt(masters)`` steps fp32 masters on the sums (clipped by
    ``clip_grad_norm_`` when ``max_norm``) after dividing them by the loss ``scale``, unless
    one is not finite (the step skipped); the parameters are the masters rounded to nearest
    even. Returns (params, masters, sums) after each step."""
    ref = Net(dtype)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    topt = make_opt(masters)
    out = []
    for mb in _batches(inf_at):
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
        grads = [t / scale for t in sums]
        if all(bool(torch.isfinite(t).all()) for t in grads):
            for m, t in zip(masters, grads):
                m.grad = t
            if max_norm:
                torch.nn.utils.clip_grad_norm_(masters, max_norm)
            topt.step()
            with torch.no_grad():
                for p, m in zip(ref.parameters(), masters):
                    p.copy_(m)
        out.append(([p.detach().clone() for p in ref.parameters()],
                    [m.detach().clone() for m in masters], sums))
    return out


def _train_offloaded(dtype, tier, tmp_path, make_opt, want, fp32_sum=True):
    """The offloaded model (a working set smaller than the model: parameters fetched and
    released within each pass) under ``make_opt(params)``; asserts ``p.grad`` and the
    parameters against ``want`` at every step."""
    model = Net(dtype)
    h = st.offload_parameters(model, path=str(tmp_path / "p"), tier=tier, working_set=256)
    opt = make_opt(model.parameters())
    for s, mb in enumerate(_batches()):
        opt.zero_grad(set_to_none=True)
        for x, y in mb:
            F.mse_loss(model(x), y).backward()
        for i, (p, t) in enumerate(zip(model.parameters(), want[s][2])):
            # the fp32 sum rounded (fp32_sum), or torch's own p.grad (t is it widened)
            assert p.grad.dtype == dtype and torch.equal(p.grad.clone(), t.to(dtype)), (s, i)
        opt.step()
        for i, (p, r) in enumerate(zip(model.parameters(), want[s][0])):
            assert torch.equal(h.read(p), r), (s, i)
    return model, h, opt


def _masters_equal(opt, want):
    state = opt.state_dict()["state"]
    for i, m in enumerate(want[-1][1]):
        assert torch.equal(state[i]["master_param"].view(m.shape), m), i


OPTIMIZERS = {
    "AdamW": (lambda m: torch.optim.AdamW(m, lr=1e-2, weight_decay=0.1), 0.0,
              lambda ps, d: st.OffloadAdamW(ps, lr=1e-2, weight_decay=0.1, path=d["path"],
                                            tier=d["tier"], arithmetic="torch")),
    "Adam-amsgrad-clipped": (lambda m: torch.optim.Adam(m, lr=1e-2, amsgrad=True), 0.05,
                             lambda ps, d: st.OffloadAdam(ps, lr=1e-2, amsgrad=True,
                                                          max_grad_norm=0.05,
                                                          path=d["path"], tier=d["tier"],
                                                          arithmetic="torch")),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_accumulation_equals_torch_by_hand(tmp_path, name, tier, dtype):
    ref_opt, max_norm, ours = OPTIMIZERS[name]
    want = _reference(dtype, ref_opt, max_norm=max_norm)
    other = _reference(dtype, ref_opt, fp32_sum=False, max_norm=max_norm)
    assert any(not torch.equal(a, b) for a, b in zip(want[-1][0], other[-1][0])), \
        "the data must tell fp32 accumulation from torch's"
    if max_norm:  # the clipping is active in every step
        assert all(float(torch.norm(torch.stack([torch.norm(t) for t in w[2]]))) > max_norm
                   for w in want)
    d = dict(path=str(tmp_path / "o"), tier=tier)
    model, h, opt = _train_offloaded(dtype, tier, tmp_path,
                                     lambda ps: ours(ps, d), want)
    _masters_equal(opt, want)
    opt.close()
    h.close()


@pytest.mark.parametrize("tier", TIERS)
def test_the_gradient_object_holds_the_fp32_sum(tmp_path, tier):
    for mode, elem in ((None, 4), ("param", 2)):
        model = Net(torch.bfloat16)
        h = st.offload_parameters(model, path=str(tmp_path / f"p{elem}"), tier=tier)
        opt = st.OffloadAdamW(model.parameters(), path=str(tmp_path / f"o{elem}"), tier=tier,
                              grad_accumulation_dtype=mode)
        x, y = _batches()[0][0]
        h.reset_stats()
        F.mse_loss(model(x), y).backward()
        h.flush_grads()
        for n, p in model.named_parameters():
            assert h.store.stat(f"params/{n}#grad").nbytes == p.numel() * elem, (mode, n)
        numel = sum(p.numel() for p in model.parameters())
        assert h.stats()["grad_bytes_written"] == numel * elem, mode
        opt.close()
        h.close()


@pytest.mark.parametrize("tier", TIERS)
def test_param_option_is_torchs_accumulation(tmp_path, tier):
    ref_opt, _, _ = OPTIMIZERS["AdamW"]
    want = _reference(torch.bfloat16, ref_opt, fp32_sum=False)
    d = dict(path=str(tmp_path / "o"), tier=tier)
    model, h, opt = _train_offloaded(
        torch.bfloat16, tier, tmp_path,
        lambda ps: st.OffloadAdamW(ps, lr=1e-2, weight_decay=0.1, path=d["path"], tier=tier,
                                   arithmetic="torch", grad_accumulation_dtype="param"),
        want, fp32_sum=False)
    _masters_equal(opt, want)
    opt.close()
    h.close()


def _edited_run(model, opt, offload=None):
    """A script that edits p.grad between micro-batches; the parameters after each step."""
    out = []
    for s, mb in enumerate(_batches()):
        opt.zero_grad(set_to_none=(s != 1))  # step 1: the sums restart from zeros
        for k, (x, y) in enumerate(mb):
            F.mse_loss(model(x), y).backward()
            if s == 0 and k == 1:
                for p in model.parameters():
                    p.grad.mul_(0.5)  # the next backward adds to p.grad, widened
            if s == 2 and k == 0:
                for p in model.parameters():
                    p.grad.clamp_(-0.01, 0.01)  # (offloaded: on the materialized values)
        if s == 2:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # mul_ by 1: an edit
        shown = [p.grad.clone() for p in model.parameters()]
        opt.step()
        vals = [offload.read(p) if offload else p.detach().clone() for p in model.parameters()]
        out.append((shown, vals))
    return out


@pytest.mark.parametrize("tier", TIERS)
def test_edits_of_p_grad_as_for_in_memory_parameters(tmp_path, tier):
    mem = Net(torch.bfloat16)
    mopt = st.OffloadAdamW(mem.parameters(), lr=1e-2, path=str(tmp_path / "m"), tier=tier,
                           arithmetic="torch")
    want = _edited_run(mem, mopt)
    model = Net(torch.bfloat16)
    h = st.offload_parameters(model, path=str(tmp_path / "p"), tier=tier, working_set=256)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, path=str(tmp_path / "o"), tier=tier,
                          arithmetic="torch")
    got = _edited_run(model, opt, h)
    for s, ((gs, gv), (ws, wv)) in enumerate(zip(got, want)):
        for i in range(len(gv)):
            assert torch.equal(gs[i], ws[i]) and torch.equal(gv[i], wv[i]), (s, i)
    # and the edits mattered: without them the parameters differ
    plain = Net(torch.bfloat16)
    popt = st.OffloadAdamW(plain.parameters(), lr=1e-2, path=str(tmp_path / "n"), tier=tier,
                           arithmetic="torch")
    for mb in _batches()[:1]:
        for x, y in mb:
            F.mse_loss(plain(x), y).backward()
        popt.step()
    assert any(not torch.equal(a.detach(), b) for a, b in zip(plain.parameters(), want[0][1]))
    for o in (mopt, opt, popt):
        o.close()
    h.close()


def test_zero3_two_ranks_reduce_and_sum_in_fp32(tmp_path):
    """ZeRO-3 (offload_parameters(comm=...)), 2 ranks under strata launch: each
    micro-batch's gradient widened, reduce-scattered and averaged in fp32, summed in fp32
    (tests/bindings/torch_offload/zero3_fp32_accum_worker.py checks every parameter against
    torch by hand after every step)."""
    import os
    import subprocess
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_distributed import _check_ranks, _free_port_pair, _strata_cli
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "zero3_fp32_accum_worker.py")
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "200", "--", sys.executable, worker, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=250)
    _check_ranks(r, "zero3-fp32-accum", range(2), lambda k: f"[rank {k}] ")


def _same(a, b):
    """torch.equal, NaN equal to NaN (an overflowing step's gradients)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


@pytest.mark.parametrize("tier", TIERS)
def test_fp16_under_the_loss_scaler_with_an_overflow(tmp_path, tier):
    # init 1024, window 2, hysteresis 2: step 1 overflows (uses up the hysteresis), no
    # growth before step 4: every step's scale is 1024 (DeepSpeed's rule, by hand)
    ref_opt, _, _ = OPTIMIZERS["AdamW"]
    want = _reference(torch.float16, ref_opt, scale=1024.0, inf_at=1)
    model = Net(torch.float16)
    h = st.offload_parameters(model, path=str(tmp_path / "p"), tier=tier, working_set=256)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1,
                          path=str(tmp_path / "o"), tier=tier, arithmetic="torch")
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2)
    for s, mb in enumerate(_batches(inf_at=1)):
        opt.zero_grad(set_to_none=True)
        for x, y in mb:
            scaler.scale(F.mse_loss(model(x), y)).backward()
        for i, (p, t) in enumerate(zip(model.parameters(), want[s][2])):
            assert _same(p.grad.clone(), t.to(torch.float16)), (s, i)
        scaler.step(opt)
        scaler.update()
        assert opt.last_step["skipped"] == (s == 1), s
        for i, (p, r) in enumerate(zip(model.parameters(), want[s][0])):
            assert torch.equal(h.read(p), r), (s, i)
    assert scaler.get_scale() == 1024.0 and scaler.overflows == 1
    other = _reference(torch.float16, ref_opt, fp32_sum=False, scale=1024.0, inf_at=1)
    assert any(not torch.equal(a, b) for a, b in zip(want[-1][0], other[-1][0]))
    opt.close()
    h.close()
