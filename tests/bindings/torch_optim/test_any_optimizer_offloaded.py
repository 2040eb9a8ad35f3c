"""strata.torch.optim.OffloadOptimizer over parameters offloaded by
``strata.torch.offload_parameters`` (optim/_any_offloaded.py): gradients read from the
offload's store, fp32 masters in the optimizer's store, updated values stored back.

* SGD (momentum), RMSprop, AdamW with a StepLR scheduler, two param groups, a working set
  smaller than the model (parameters evicted, several batches per step), nvme and host
  tiers: parameters (read through the model) and state_dict() torch.equal to the same
  class in memory after every step;
* bf16 parameters, 2 micro-batches per step: fp32 sums in the offload's store, fp32
  masters -- torch.equal to the same OffloadOptimizer over the model in memory (parameters,
  masters, state);
* checkpoint + resume (``resume=True`` on both offload_parameters and the optimizer, a
  model with other weights) continues bit-identically;
* a parameter edited outside the optimizer (``model.load_state_dict``) is stepped from its
  new value, as torch.optim steps it.
* bf16 parameters, the offload closed after 2 steps (OffloadOptimizer(AdamW) and
  OffloadAdamW): the fp32 masters stay, 2 more steps torch.equal to the optimizer over the
  model never offloaded; an edit after the close (in place, ``p.data = t``,
  ``load_state_dict``) is taken as the master; OffloadAdamW over bf16 parameters offloaded
  after it took them keeps its masters.
"""
import pytest
import torch
import torch.nn.functional as F

import strata.torch as st
from strata.torch.offload import is_offloaded
from strata.torch.optim import DynamicLossScaler, OffloadOptimizer

TIERS = ["nvme", "host"]
CLASSES = [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01), dict(lr=0.05)),
    (torch.optim.RMSprop, dict(lr=0.01, momentum=0.9), dict(lr=0.02, centered=False)),
    (torch.optim.AdamW, dict(lr=0.01), dict(lr=0.02, weight_decay=0.1)),
]
IDS = [c.__name__ for c, _, _ in CLASSES]
WORKING_SET = 4096  # bytes: less than one 64x32 fp32 weight (8 KiB)


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 5)).to(dtype)


def _groups(model, g1):
    return [{"params": list(model[0].parameters())},
            {"params": list(model[2].parameters()), **g1}]


def _data(steps, seed=1, micro=1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(16, 32, generator=g), torch.randint(0, 5, (16,), generator=g))
             for _ in range(micro)] for _ in range(steps)]


def _step(model, opt, batch, sched=None):
    opt.zero_grad()
    dtype = next(iter(model.parameters())).dtype
    for x, y in batch:
        F.cross_entropy(model(x.to(dtype)).float(), y).backward()
    opt.step()
    if sched is not None:
        sched.step()


def _assert_same(m1, o1, m2, o2):
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.detach(), b.detach())
    s1, s2 = o1.state_dict(), o2.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for i in s1["state"]:
        e1, e2 = s1["state"][i], s2["state"][i]
        assert e1.keys() == e2.keys(), i
        for k in e1:
            if isinstance(e1[k], torch.Tensor):
                assert torch.equal(e1[k], e2[k]), (i, k)
            else:
                assert e1[k] == e2[k], (i, k)
    assert s1["param_groups"] == s2["param_groups"]


def _offloaded(model, tmp_path, tier, resume=False):
    return st.offload_parameters(model, path=str(tmp_path / "params"), tier=tier,
                                 working_set=WORKING_SET, resume=resume)


def _optimizer(cls, model, g0, g1, tmp_path, resume=False):
    return OffloadOptimizer(cls, _groups(model, g1), path=str(tmp_path / "optim"),
                            sub_group_numel=256, resume=resume, **g0)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("cls,g0,g1", CLASSES, ids=IDS)
def test_offloaded_parameters_step_as_the_class_in_memory(cls, g0, g1, tier, tmp_path):
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, g1), **g0)
    h = _offloaded(m_off, tmp_path, tier)
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, 2, gamma=0.5)
    s_off = torch.optim.lr_scheduler.StepLR(off, 2, gamma=0.5)
    for batch in _data(4):
        _step(m_ref, ref, batch, s_ref)
        _step(m_off, off, batch, s_off)
        _assert_same(m_ref, ref, m_off, off)
    stats = h.stats()
    assert stats["grad_bytes_read"] > 0 and stats["param_bytes_written"] > 0
    assert stats["peak_working_set_bytes"] <= 2 * 64 * 32 * 4  # parameters were evicted
    assert all(is_offloaded(p) for p in m_off.parameters())
    off.close()
    h.close()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("cls,g0,g1", CLASSES, ids=IDS)
def test_bf16_offloaded_parameters_fp32_masters_and_sums(cls, g0, g1, tier, tmp_path):
    """bf16 parameters, 2 micro-batches a step: the same as OffloadOptimizer over the model
    in memory (fp32 sums of the micro-batch gradients, fp32 masters; itself the class on
    fp32 masters, tests/bindings/torch_optim/test_any_optimizer_masters.py)."""
    m_mem, m_off = _model(dtype=torch.bfloat16), _model(dtype=torch.bfloat16)
    mem = OffloadOptimizer(cls, _groups(m_mem, g1), path=str(tmp_path / "mem"), **g0)
    h = _offloaded(m_off, tmp_path, tier)
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    for batch in _data(4, micro=2):
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
        _assert_same(m_mem, mem, m_off, off)  # (masters: state_dict's master_param)
    assert h.stats()["grad_bytes_written"] > 0
    for o in (mem, off):
        o.close()
    h.close()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("cls,g0,g1", CLASSES, ids=IDS)
def test_checkpoint_resume_continues_bit_identical(cls, g0, g1, tier, tmp_path):
    data = _data(4)
    m_ref = _model()
    ref = cls(_groups(m_ref, g1), **g0)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, 1, gamma=0.7)
    m_off = _model()
    h = _offloaded(m_off, tmp_path, tier)
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    s_off = torch.optim.lr_scheduler.StepLR(off, 1, gamma=0.7)
    for batch in data[:2]:
        _step(m_ref, ref, batch, s_ref)
        _step(m_off, off, batch, s_off)
    sched = s_off.state_dict()
    off.checkpoint()
    h.checkpoint()
    off.close()
    h.close(restore=False)
    m_new = _model(seed=5)  # other weights: the resume gives the checkpoint's
    h2 = _offloaded(m_new, tmp_path, tier, resume=True)
    off2 = _optimizer(cls, m_new, dict(g0, lr=123.0), g1, tmp_path, resume=True)
    s_off2 = torch.optim.lr_scheduler.StepLR(off2, 1, gamma=0.7)
    s_off2.load_state_dict(sched)
    _assert_same(m_ref, ref, m_new, off2)
    for batch in data[2:]:
        _step(m_ref, ref, batch, s_ref)
        _step(m_new, off2, batch, s_off2)
        _assert_same(m_ref, ref, m_new, off2)
    off2.close()
    h2.close()


def test_bf16_resume_keeps_fp32_masters(tmp_path):
    cls, g0, g1 = CLASSES[2]
    data = _data(4, micro=2)
    m_mem = _model(dtype=torch.bfloat16)
    mem = OffloadOptimizer(cls, _groups(m_mem, g1), path=str(tmp_path / "mem"), **g0)
    m_off = _model(dtype=torch.bfloat16)
    h = _offloaded(m_off, tmp_path, "nvme")
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    for batch in data[:2]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
    off.close()  # (its last checkpoint)
    h.close(restore=False)
    m_new = _model(seed=5, dtype=torch.bfloat16)
    h2 = _offloaded(m_new, tmp_path, "nvme", resume=True)
    off2 = _optimizer(cls, m_new, g0, g1, tmp_path, resume=True)
    for batch in data[2:]:
        _step(m_mem, mem, batch)
        _step(m_new, off2, batch)
        _assert_same(m_mem, mem, m_new, off2)
    for o in (mem, off2):
        o.close()
    h2.close()


def test_edit_outside_the_optimizer_is_stepped_from(tmp_path):
    cls, g0, g1 = CLASSES[0]
    data = _data(3)
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, g1), **g0)
    h = _offloaded(m_off, tmp_path, "nvme")
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    _step(m_ref, ref, data[0])
    _step(m_off, off, data[0])
    new = _model(seed=7).state_dict()
    m_ref.load_state_dict(new)
    m_off.load_state_dict(new)
    with torch.no_grad():
        m_ref[2].bias.mul_(0.5)
        m_off[2].bias.mul_(0.5)
    for batch in data[1:]:
        _step(m_ref, ref, batch)
        _step(m_off, off, batch)
        _assert_same(m_ref, ref, m_off, off)
    off.close()
    h.close()


@pytest.mark.parametrize("bad", [0, 3])  # an inf in the first / the last parameter's gradient
def test_loss_scaler_skips_the_whole_step(bad, tmp_path):
    """Under a DynamicLossScaler a step with an inf in one offloaded gradient is skipped
    whole (no batch stepped), the others as the same optimizer over the model in memory."""
    cls, g0, g1 = CLASSES[2]
    m_mem, m_off = _model(), _model()
    mem = OffloadOptimizer(cls, _groups(m_mem, g1), path=str(tmp_path / "mem"), **g0)
    h = _offloaded(m_off, tmp_path, "nvme")
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    scalers = [DynamicLossScaler(init_scale=1024.0, scale_window=2) for _ in range(2)]
    for s, batch in enumerate(_data(4)):
        for m, o, sc in ((m_mem, mem, scalers[0]), (m_off, off, scalers[1])):
            o.zero_grad()
            for x, y in batch:
                sc.scale(F.cross_entropy(m(x), y)).backward()
            if s == 1:
                with torch.no_grad():
                    list(m.parameters())[bad].grad.view(-1)[1] = float("inf")
            sc.step(o)
            sc.update()
            assert o.last_step["skipped"] == (s == 1), s
        _assert_same(m_mem, mem, m_off, off)
    for o in (mem, off):
        o.close()
    h.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_offloaded_after_the_optimizer_took_them(dtype, tmp_path):
    """Two steps in memory, then offload_parameters: the optimizer steps them through the
    store from then on, the masters kept (a bf16 parameter's fp32 master keeps its
    precision); the same as the optimizer over the model left in memory. (One micro-batch
    a step; several, against torch by hand with fp32 sums:
    test_offloaded_after_optimizer_fp32_accum.py.)"""
    cls, g0, g1 = CLASSES[2]
    data = _data(4)
    m_mem, m_off = _model(dtype=dtype), _model(dtype=dtype)
    mem = OffloadOptimizer(cls, _groups(m_mem, g1), path=str(tmp_path / "mem"), **g0)
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    for batch in data[:2]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
    h = _offloaded(m_off, tmp_path, "nvme")
    for batch in data[2:]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
        _assert_same(m_mem, mem, m_off, off)
    assert h.stats()["grad_bytes_read"] > 0
    for o in (mem, off):
        o.close()
    h.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_state_dict_over_offloaded_parameters(dtype, tmp_path):
    """A state dict (with ``master_param``) of the optimizer over the model in memory loaded
    into the one over offloaded parameters (of other values): the same afterwards."""
    cls, g0, g1 = CLASSES[2]
    data = _data(4)
    m_mem, m_off = _model(dtype=dtype), _model(seed=3, dtype=dtype)
    mem = OffloadOptimizer(cls, _groups(m_mem, g1), path=str(tmp_path / "mem"), **g0)
    h = _offloaded(m_off, tmp_path, "host")
    off = _optimizer(cls, m_off, g0, g1, tmp_path)
    _step(m_off, off, data[0])
    for batch in data[:2]:
        _step(m_mem, mem, batch)
    m_off.load_state_dict(m_mem.state_dict())
    off.load_state_dict(mem.state_dict())
    _assert_same(m_mem, mem, m_off, off)
    for batch in data[2:]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
        _assert_same(m_mem, mem, m_off, off)
    for o in (mem, off):
        o.close()
    h.close()


def _make(kind, model, tmp_path, name):
    """OffloadOptimizer(AdamW) or OffloadAdamW over ``model`` (same hyperparameters)."""
    if kind == "OffloadOptimizer":
        cls, g0, g1 = CLASSES[2]
        return OffloadOptimizer(cls, _groups(model, g1), path=str(tmp_path / name), **g0)
    return st.OffloadAdamW([{"params": list(model[0].parameters())},
                            {"params": list(model[2].parameters()), "lr": 0.02,
                             "weight_decay": 0.1}], lr=0.01, path=str(tmp_path / name),
                           num_threads=1, arithmetic="torch")


def _masters(opt):
    return [e["master_param"] for _, e in sorted(opt.state_dict()["state"].items())]


KINDS = ["OffloadOptimizer", "OffloadAdamW"]


@pytest.mark.parametrize("edit", [None, "in_place", "data", "load_state_dict"])
@pytest.mark.parametrize("kind", KINDS)
def test_closed_offload_keeps_the_fp32_masters(kind, edit, tmp_path):
    """bf16 parameters offloaded, 2 steps, the offload closed (the parameters back in
    memory: each the rounding of its fp32 master), 2 more steps: the masters stay (not the
    bf16 values) -- parameters and ``master_param`` torch.equal to the same optimizer over
    the model never offloaded. An edit after the close (in place, ``p.data = t``,
    ``model.load_state_dict``; the same on both) is taken as the master, as in memory."""
    data = _data(4)
    m_mem, m_off = _model(dtype=torch.bfloat16), _model(dtype=torch.bfloat16)
    mem = _make(kind, m_mem, tmp_path, "mem")
    h = _offloaded(m_off, tmp_path, "nvme")
    off = _make(kind, m_off, tmp_path, "off")
    for batch in data[:2]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
    h.close()
    assert not any(is_offloaded(p) for p in m_off.parameters())
    assert any(not torch.equal(m, p.detach().float().view(-1))  # (masters hold more bits)
               for m, p in zip(_masters(off), m_off.parameters()))
    new = _model(seed=7, dtype=torch.bfloat16)
    for m in (m_mem, m_off):
        with torch.no_grad():
            if edit == "in_place":
                m[2].bias.mul_(0.5)
            elif edit == "data":
                m[0].weight.data = new[0].weight.detach().clone()
            elif edit == "load_state_dict":
                m.load_state_dict(new.state_dict())
    for batch in data[2:]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
        for a, b in zip(m_mem.parameters(), m_off.parameters()):
            assert torch.equal(a.detach(), b.detach())
        for a, b in zip(_masters(mem), _masters(off)):
            assert torch.equal(a, b)
    for o in (mem, off):
        o.close()


def test_offload_adamw_keeps_masters_of_parameters_offloaded_after(tmp_path):
    """OffloadAdamW over bf16 parameters: 2 steps in memory, then offload_parameters, 2
    steps: the masters kept (as OffloadOptimizer's, above), torch.equal to the optimizer
    over the model left in memory."""
    data = _data(4)
    m_mem, m_off = _model(dtype=torch.bfloat16), _model(dtype=torch.bfloat16)
    mem, off = _make("OffloadAdamW", m_mem, tmp_path, "mem"), _make("OffloadAdamW", m_off,
                                                                    tmp_path, "off")
    for batch in data[:2]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
    h = _offloaded(m_off, tmp_path, "nvme")
    for batch in data[2:]:
        _step(m_mem, mem, batch)
        _step(m_off, off, batch)
        for a, b in zip(m_mem.parameters(), m_off.parameters()):
            assert torch.equal(a.detach(), h.read(b))
        for a, b in zip(_masters(mem), _masters(off)):
            assert torch.equal(a, b)
    assert h.stats()["grad_bytes_read"] > 0
    for o in (mem, off):
        o.close()
    h.close()
