"""strata.torch.optim.DynamicLossScaler (fp16 dynamic loss scaling, optim/_loss_scale.py):

* the scale sequence over scripted overflow patterns, driven through a real strata
  optimizer, equals DeepSpeed's rule (deepspeed/runtime/fp16/loss_scaler.py,
  DynamicLossScaler.update_scale), every expected value written by hand from the rule;
* a small training with an injected inf, bit for bit against in-memory torch doing the same
  by hand (gradients divided by the scale, the overflowing steps skipped): fp16 parameters
  with fp32 masters, fp32 with clipping (max_grad_norm sees the unscaled norm), over
  offloaded parameters, and OffloadOptimizer(torch.optim.AdamW); nvme and host tiers;
* bad arguments and refused combinations; state_dict round trip; enabled=False;
* torch's own GradScaler driving strata's optimizer (CUDA only in torch 1.13).
Two ranks: tests/bindings/torch_optim/test_loss_scale_ranks.py."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import strata.torch as st
from strata.torch.optim import DynamicLossScaler, OffloadOptimizer

TIERS = ["nvme", "host"]
INF = float("inf")


# ---- (1) the scale sequence ---------------------------------------------------------------

def _tiny(tmp_path, tier="host"):
    p = torch.nn.Parameter(torch.zeros(4))
    return p, st.OffloadAdamW([p], lr=0.1, path=str(tmp_path / "s"), tier=tier)


def _drive(scaler, opt, p, pattern):
    """One iteration per entry of ``pattern`` ("O": a gradient holding inf, "C": finite):
    the scale and hysteresis left after each update(); checks every step's skip."""
    scales, left = [], []
    for i, c in enumerate(pattern):
        opt.zero_grad()
        p.grad = torch.full((4,), 1.0)
        if c == "O":
            p.grad[1] = INF if i % 2 else float("nan")
        before = p.detach().clone()
        steps = opt.state_dict()["state"].get(0, {}).get("step")
        scaler.step(opt)
        assert opt.last_step["skipped"] == (c == "O"), i
        if c == "O":  # nothing changed
            assert torch.equal(p, before), i
            assert opt.state_dict()["state"].get(0, {}).get("step") == steps, i
        scaler.update()
        assert scaler.last_overflow == (c == "O")
        scales.append(scaler.get_scale())
        left.append(scaler.hysteresis_left)
    return scales, left


def test_default_rule_hysteresis_then_halving_then_growth(tmp_path):
    # DeepSpeed's defaults (2**16, hysteresis 2, min 1, factor 2) with scale_window 3. By
    # hand: the first overflow only uses up the hysteresis (2 -> 1); each later one halves
    # (the hysteresis is not refilled by clean steps, consecutive_hysteresis=False); growth
    # when the clean iterations before the current clean one, since the last overflow, are
    # a positive multiple of 3 (i.e. on the 4th, 7th, ... clean one), refilling it.
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler(scale_window=3)
    assert (s.get_scale(), s.hysteresis, s.min_scale, s.scale_factor) == (65536.0, 2, 1.0, 2.0)
    scales, left = _drive(s, opt, p, "OOOCCCCCCCOCOCCCC")
    assert scales == [65536, 32768, 16384, 16384, 16384, 16384, 32768, 32768, 32768, 65536,
                      65536, 65536, 32768, 32768, 32768, 32768, 65536]
    assert left == [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2]
    assert (s.iteration, s.last_overflow_iteration, s.overflows) == (17, 12, 5)
    assert opt.state_dict()["state"][0]["step"] == 12  # the 12 clean steps
    opt.close()


def test_growth_from_the_start_and_default_window(tmp_path):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler(init_scale=1.0, scale_window=2)
    # no overflow yet (last overflow "at -1"): growth on the 3rd and 5th clean iterations
    assert _drive(s, opt, p, "CCCCC")[0] == [1, 1, 2, 2, 4]
    d = DynamicLossScaler()
    assert d.scale_window == 1000
    assert _drive(d, opt, p, "C" * 1001)[0][-2:] == [65536, 131072]  # the 1001st grows
    opt.close()


def test_consecutive_hysteresis_refills_at_every_clean_step(tmp_path):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler(init_scale=8.0, scale_window=2, hysteresis=3,
                          consecutive_hysteresis=True)
    scales, left = _drive(s, opt, p, "OCOOOCCCCC")
    assert scales == [8, 8, 8, 8, 4, 4, 4, 8, 8, 16]
    assert left == [2, 3, 2, 1, 1, 3, 3, 3, 3, 3]
    opt.close()


def test_min_scale_floor_and_error_at_the_minimum(tmp_path):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler(init_scale=12.0, min_scale=4.0, hysteresis=1)
    assert _drive(s, opt, p, "OO")[0] == [6, 4]  # max(12/2, 4), max(6/2, 4)
    p.grad = torch.full((4,), INF)
    s.step(opt)
    with pytest.raises(RuntimeError, match=r"minimum loss scale \(min_scale=4.0\)"):
        s.update()
    assert (s.get_scale(), s.iteration) == (4.0, 2)  # unchanged
    q, opt2 = _tiny(tmp_path / "b")
    t = DynamicLossScaler(init_scale=12.0, min_scale=4.0, hysteresis=1,
                          raise_error_at_min_scale=False)
    assert _drive(t, opt2, q, "OOOOC")[0] == [6, 4, 4, 4, 4]
    opt.close()
    opt2.close()


def test_state_dict_round_trip_continues_the_sequence(tmp_path):
    p, opt = _tiny(tmp_path)
    a = DynamicLossScaler(init_scale=64.0, scale_window=2)
    _drive(a, opt, p, "OCOC")
    sd = a.state_dict()
    assert sd == dict(init_scale=64.0, scale_window=2, hysteresis=2, min_scale=1.0,
                      scale_factor=2.0, consecutive_hysteresis=False,
                      raise_error_at_min_scale=True, scale=32.0, iteration=4,
                      last_overflow_iteration=2, hysteresis_left=1, overflows=2, enabled=True)
    b = DynamicLossScaler()
    b.load_state_dict(sd)
    assert b.state_dict() == sd
    rest = "CCOCC"
    assert _drive(b, opt, p, rest) == _drive(a, opt, p, rest)
    with pytest.raises(KeyError, match="hysteresis_left"):
        DynamicLossScaler().load_state_dict({k: v for k, v in sd.items()
                                             if k != "hysteresis_left"})
    with pytest.raises(ValueError, match="scale_window"):
        DynamicLossScaler().load_state_dict({**sd, "scale_window": 0})
    opt.close()


# ---- (2) training, bit for bit against torch by hand -------------------------------------

class Net(torch.nn.Module):
    """Parameters in ``dtype``, arithmetic in fp32 (fp16 matmuls are not on torch 1.13's
    CPU): fp16 parameters get fp16 gradients (the cast's backward)."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.to(dtype)
        self.half = dtype == torch.float16

    def forward(self, x):
        if not self.half:  # the modules' own calls (parameter offload's hooks)
            return self.l2(torch.tanh(self.l1(x)))
        h = torch.tanh(F.linear(x, self.l1.weight.float(), self.l1.bias.float()))
        return F.linear(h, self.l2.weight.float(), self.l2.bias.float())


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g))
            for _ in range(n)]


# init 2**10, window 2, DeepSpeed's hysteresis 2; inf injected at steps 2 and 3: step 2
# uses up the hysteresis, step 3 halves; growth on the 3rd clean step after (step 6).
# The scale each step's backward uses, by hand from the rule:
INJECT = (2, 3)
SCALES = [1024, 1024, 1024, 1024, 512, 512, 512, 1024]


def _inputs(step, x, how):
    """The batch of ``step``; with ``how="input"`` an inf in it at the injected steps
    (inf/NaN gradients through backward)."""
    if how == "input" and step in INJECT:
        x = x.clone()
        x[0, 3] = INF
    return x


def _inject(model, step, how):
    if how == "grad" and step in INJECT:
        model.l2.weight.grad[0, 1] = INF


def _reference(dtype, max_norm, how):
    """torch by hand: fp32 masters, AdamW, gradients / scale, overflowing steps skipped;
    (params, optimizer state dict) after each step."""
    ref = Net(dtype)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    topt = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)
    out = []
    for step, (x, y) in enumerate(_batches(len(SCALES))):
        for p in ref.parameters():
            p.grad = None
        (F.mse_loss(ref(_inputs(step, x, how)), y) * SCALES[step]).backward()
        _inject(ref, step, how)
        grads = [p.grad.float() / SCALES[step] for p in ref.parameters()]
        if all(bool(torch.isfinite(g).all()) for g in grads):
            for m, g in zip(masters, grads):
                m.grad = g
            if max_norm:
                torch.nn.utils.clip_grad_norm_(masters, max_norm)
            topt.step()
            with torch.no_grad():
                for p, m in zip(ref.parameters(), masters):
                    p.copy_(m)  # fp16: round to nearest even, as strata's kernel
        out.append(([p.detach().clone() for p in ref.parameters()],
                    copy.deepcopy(topt.state_dict()),
                    [m.detach().clone() for m in masters]))
    return out


def _same_state(got, want, masters):
    """strata's state dict against torch's; fp16 parameters' ``master_param`` (strata's
    fp32 master) against the fp32 master kept by hand."""
    assert sorted(got["state"]) == sorted(want["state"])
    for i, w in want["state"].items():
        g = dict(got["state"][i])
        if "master_param" in g:
            assert torch.equal(g.pop("master_param"), masters[i]), i
        assert sorted(g) == sorted(w), i
        for k, v in w.items():
            if isinstance(v, torch.Tensor) and isinstance(g[k], torch.Tensor):
                assert torch.equal(g[k], v), (i, k)
            else:
                assert float(g[k]) == float(v), (i, k)


def _train(model, opt, scaler, how, want, handle=None):
    for step, (x, y) in enumerate(_batches(len(SCALES))):
        assert scaler.get_scale() == SCALES[step], step
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(_inputs(step, x, how)), y)).backward()
        _inject(model, step, how)
        scaler.step(opt)
        scaler.update()
        assert opt.last_step["skipped"] == (step in INJECT), step
        params = [handle.read(p) if handle else p.detach() for p in model.parameters()]
        for got, ref in zip(params, want[step][0]):
            assert got.dtype == ref.dtype and torch.equal(got, ref), step
        _same_state(opt.state_dict(), want[step][1], want[step][2])
    # grown at step 6 (clean ones before it since the overflow at 3: 2); step 7's: 3
    assert scaler.overflows == 2 and scaler.get_scale() == 1024


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("case", ["fp16-params", "fp32-clipped", "OffloadOptimizer-AdamW"])
def test_training_with_an_injected_overflow_equals_torch_by_hand(tmp_path, tier, case):
    dtype = torch.float16 if case == "fp16-params" else torch.float32
    max_norm = 0.05 if case == "fp32-clipped" else 0.0
    want = _reference(dtype, max_norm, "grad")
    model = Net(dtype)
    if case == "OffloadOptimizer-AdamW":
        opt = OffloadOptimizer(torch.optim.AdamW, model.parameters(), lr=1e-2,
                               weight_decay=0.1, path=str(tmp_path / "s"), tier=tier)
    else:
        opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1,
                              path=str(tmp_path / "s"), tier=tier, arithmetic="torch",
                              max_grad_norm=max_norm)
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2)
    _train(model, opt, scaler, "grad", want)
    opt.close()


def test_training_over_offloaded_parameters_equals_torch_by_hand(tmp_path):
    import strata
    want = _reference(torch.float32, 0.05, "input")
    model = Net(torch.float32)
    store = strata.Store.open(str(tmp_path / "s"), chunk_size="64KiB")
    h = st.offload_parameters(model, store, working_set=2048)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, store=store,
                          arithmetic="torch", max_grad_norm=0.05)
    scaler = DynamicLossScaler(init_scale=1024.0, scale_window=2)
    _train(model, opt, scaler, "input", want, handle=h)  # the gradients reach the store
    opt.close()
    h.close()
    store.close()


# ---- (4) bad arguments, refused combinations ---------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(init_scale=0), "init_scale"), (dict(init_scale=-1.0), "init_scale"),
    (dict(init_scale=math.inf), "init_scale"), (dict(init_scale=math.nan), "init_scale"),
    (dict(init_scale="1"), "init_scale"), (dict(scale_window=0), "scale_window"),
    (dict(scale_window=2.0), "scale_window"), (dict(scale_window=True), "scale_window"),
    (dict(hysteresis=0), "hysteresis"), (dict(hysteresis=-2), "hysteresis"),
    (dict(min_scale=0.0), "min_scale"), (dict(scale_factor=1.0), "scale_factor"),
    (dict(scale_factor=0.5), "scale_factor"), (dict(init_scale=0.5), "min_scale"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(consecutive_hysteresis=1), "consecutive_hysteresis"),
    (dict(raise_error_at_min_scale="no"), "raise_error_at_min_scale"),
    (dict(enabled=None), "enabled"), (dict(comm=object()), "comm"),
])
def test_bad_types_name_the_argument(kwargs, name):
    with pytest.raises(TypeError, match=name):
        DynamicLossScaler(**kwargs)


def test_refused_uses(tmp_path):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler()
    with pytest.raises(TypeError, match="torch's GradScaler"):
        s.step(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]))
    with pytest.raises(RuntimeError, match="no step"):
        s.update()
    with pytest.raises(RuntimeError, match="max_grad_norm"):
        s.unscale_(opt)
    with pytest.raises(ValueError, match="closure"):
        s.step(opt, lambda: 0.0)
    with pytest.raises(TypeError, match="list/tuple"):
        s.scale(3.0)
    p.grad = torch.ones(4)
    s.step(opt)
    with pytest.raises(RuntimeError, match="already called"):
        s.step(opt)
    s.update()
    with pytest.raises(ValueError, match="new_scale"):
        s.update(new_scale=0.0)
    s.update(new_scale=8.0)
    assert s.get_scale() == 8.0
    opt.close()
    q = torch.nn.Parameter(torch.zeros(4))
    ov = st.OffloadAdamW([q], lr=0.1, path=str(tmp_path / "ov"), overlap_backward=True)
    q.grad = torch.ones(4)
    with pytest.raises(ValueError, match="overlap_backward=True"):
        s.step(ov)
    ov.close()


def test_scale_keeps_dtype_and_containers():
    s = DynamicLossScaler(init_scale=4.0)
    a, b = torch.tensor(1.5), torch.tensor([2.0], dtype=torch.float64)
    assert torch.equal(s.scale(a), torch.tensor(6.0))
    out = s.scale((a, [b]))
    assert type(out) is tuple and torch.equal(out[1][0], b * 4) and out[1][0].dtype == b.dtype


def test_disabled_is_the_plain_step(tmp_path):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler(enabled=False)
    loss = torch.tensor(2.0)
    assert s.scale(loss) is loss and s.get_scale() == 1.0 and not s.is_enabled()
    p.grad = torch.full((4,), INF)
    with pytest.warns(RuntimeWarning, match="skipped"):  # the optimizer's own warning
        s.step(opt)
    s.update()
    assert s.iteration == 0
    opt.close()


def test_no_warning_for_a_skip_under_the_scaler(tmp_path, recwarn):
    p, opt = _tiny(tmp_path)
    s = DynamicLossScaler()
    p.grad = torch.full((4,), INF)
    s.step(opt)
    assert opt.last_step["skipped"]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert opt._grad_scale is None  # the scaler's factor does not outlive its step
    opt.close()


# ---- torch's own GradScaler --------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch 1.13's GradScaler (torch.cuda.amp) works on CUDA tensors "
                           "only; without a GPU it disables itself")
def test_torch_grad_scaler_drives_strata(tmp_path):
    # torch's GradScaler unscales p.grad in place (its own pass) and calls opt.step() when
    # finite; strata's step then equals torch AdamW on the CPU over the same gradients.
    model = Net(torch.float32).cuda()
    ref = [p.detach().cpu().clone().requires_grad_() for p in model.parameters()]
    topt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1,
                          path=str(tmp_path / "s"), arithmetic="torch")
    gs = torch.cuda.amp.GradScaler(init_scale=1024.0)
    for step, (x, y) in enumerate(_batches(4)):
        opt.zero_grad()
        gs.scale(F.mse_loss(model(x.cuda()), y.cuda())).backward()
        if step == 2:
            model.l2.weight.grad[0, 1] = INF
        gs.unscale_(opt)
        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        before = [p.detach().cpu().clone() for p in model.parameters()]
        gs.step(opt)
        gs.update()
        if finite:
            for r, p in zip(ref, model.parameters()):
                r.grad = p.grad.cpu()
            topt.step()
        else:
            assert all(torch.equal(b, p.cpu()) for b, p in zip(before, model.parameters()))
        assert all(torch.equal(r, p.detach().cpu()) for r, p in zip(ref, model.parameters()))
    assert gs.get_scale() == 512.0  # one backoff (torch's rule: no hysteresis)
    opt.close()
