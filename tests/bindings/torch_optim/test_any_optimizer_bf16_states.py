"""OffloadOptimizer(cls, ..., state_dtype=torch.bfloat16): the class's state tensors as bf16
in the store. Bit for bit (torch.equal) against the class in memory whose state tensors are
rounded to bf16 (nearest even, torch's .bfloat16()) after every step, on the nvme and host
tiers, across a close and resume; the state objects hold 2 bytes per element and an Adam
step moves 4 + 2 x 2 = 8 bytes per parameter each way (12 with fp32); a resume with the other
dtype, the refused classes (Adagrad, ASGD, Rprop) and bad dtypes give their errors."""
import pytest
import torch

import strata
from strata.torch.optim import OffloadOptimizer, UpdateRule

# (class, constructor arguments): the classes whose state is moments.
CLASSES = [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=False)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9)),
    (torch.optim.Adadelta, dict(lr=1.0, rho=0.8, weight_decay=0.01)),
    (torch.optim.Adamax, dict(lr=0.01, weight_decay=0.01)),
    (torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.005)),
    (torch.optim.RAdam, dict(lr=0.01, weight_decay=0.01)),
    (torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
]
IDS = [f"{c.__name__}{i}" for i, (c, _) in enumerate(CLASSES)]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 5, (16,), generator=g))
            for _ in range(steps)]


def _round_states_to_bf16(opt):
    """The reference's rounding: every element-wise state tensor to bf16 and back (exact)."""
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() >= 1:
                v.copy_(v.to(torch.bfloat16).to(torch.float32))


def _step(model, opt, x, y, ref=False):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if ref:
        _round_states_to_bf16(opt)


def _assert_same(m_ref, ref, m_off, off):
    for a, b in zip(m_ref.parameters(), m_off.parameters()):
        assert torch.equal(a, b)
    s1, s2 = ref.state_dict(), off.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for i in s1["state"]:
        e1, e2 = s1["state"][i], s2["state"][i]
        assert e1.keys() == e2.keys(), i
        for k in e1:
            if isinstance(e1[k], torch.Tensor):
                assert e2[k].dtype == torch.float32, (i, k)
                assert torch.equal(e1[k], e2[k]), (i, k)
            else:
                assert e1[k] == e2[k], (i, k)


def _offload(cls, model, kw, path, tier="nvme", **extra):
    return OffloadOptimizer(cls, model.parameters(), path=str(path), tier=tier,
                            sub_group_numel=256, chunk_size="64KiB",
                            state_dtype=torch.bfloat16, **{**kw, **extra})


@pytest.mark.parametrize("tier", ["nvme", "host"])
@pytest.mark.parametrize("cls,kw", CLASSES, ids=IDS)
def test_bf16_states_are_the_class_with_states_rounded_after_every_step(cls, kw, tier,
                                                                         tmp_path):
    m_ref, m_off = _model(), _model()
    ref = cls(m_ref.parameters(), **kw)
    data = _batches(6)
    off = _offload(cls, m_off, kw, tmp_path / "store", tier)
    try:
        for x, y in data[:3]:
            _step(m_ref, ref, x, y, ref=True)
            _step(m_off, off, x, y)
        _assert_same(m_ref, ref, m_off, off)
        # The rounding matters: the states are not those of an fp32 run.
        m32 = _model()
        o32 = cls(m32.parameters(), **kw)
        for x, y in data[:3]:
            _step(m32, o32, x, y)
        assert any(not torch.equal(o32.state[a][k], ref.state[b][k])
                   for a, b in zip(m32.parameters(), m_ref.parameters())
                   for k in ref.state[b] if isinstance(ref.state[b][k], torch.Tensor)
                   and ref.state[b][k].dim() >= 1)
    finally:
        off.close()
    # Resume (same dtype) and continue bit-identically.
    off = _offload(cls, m_off, kw, tmp_path / "store", tier, resume=True)
    try:
        for x, y in data[3:]:
            _step(m_ref, ref, x, y, ref=True)
            _step(m_off, off, x, y)
        _assert_same(m_ref, ref, m_off, off)
    finally:
        off.close()


def _adam_bytes(tmp_path, state_dtype):
    model = _model()
    opt = OffloadOptimizer(torch.optim.Adam, model.parameters(), path=str(tmp_path),
                           tier="nvme", lr=0.01, state_dtype=state_dtype)
    try:
        for x, y in _batches(2):
            _step(model, opt, x, y)
        return opt.last_step["bytes_read"], opt.last_step["bytes_written"]
    finally:
        opt.close()


def test_an_adam_step_moves_8_instead_of_12_bytes_per_parameter(tmp_path):
    n = sum(p.numel() for p in _model().parameters())
    assert n == 32 * 64 + 64 + 64 * 5 + 5  # 2437
    assert _adam_bytes(tmp_path / "f", None) == (12 * n, 12 * n)
    assert _adam_bytes(tmp_path / "b", torch.bfloat16) == (8 * n, 8 * n)


def test_state_objects_hold_bf16_and_a_resume_with_fp32_is_refused(tmp_path):
    model = _model()
    path = tmp_path / "store"
    opt = _offload(torch.optim.Adam, model, dict(lr=0.01), path)
    x, y = _batches(1)[0]
    _step(model, opt, x, y)
    opt.close()
    store = strata.Store.open(str(path))
    try:
        numels = [p.numel() for p in model.parameters()]
        for i, n in enumerate(numels):
            for s in ("exp_avg", "exp_avg_sq"):
                info = store.stat(f"optim/p/p{i}/{s}")
                assert (info.dtype, info.nbytes) == ("bf16", 2 * n), (i, s, info)
            info = store.stat(f"optim/p/p{i}/param")
            assert (info.dtype, info.nbytes) == ("fp32", 4 * n), (i, info)
    finally:
        store.close()
    with pytest.raises(strata.FailedPreconditionError,
                       match="holds bf16 optimizer states, but OffloadOptions.state_dtype "
                             "is fp32"):
        OffloadOptimizer(torch.optim.Adam, model.parameters(), path=str(path), lr=0.01,
                         resume=True)


@pytest.mark.parametrize("cls,what", [(torch.optim.Adagrad, "'sum' accumulates"),
                                      (torch.optim.ASGD, "'ax' is the running average"),
                                      (torch.optim.Rprop, "is the previous gradient and per-element")])
def test_classes_whose_state_is_not_moments_are_refused(cls, what, tmp_path):
    with pytest.raises(ValueError, match=f"state_dtype=torch.bfloat16 is refused for "
                                         f"torch.optim.{cls.__name__}: its state {what}"):
        OffloadOptimizer(cls, _model().parameters(), path=str(tmp_path), lr=0.01,
                         state_dtype=torch.bfloat16)
    # fp32 states stay available for them.
    opt = OffloadOptimizer(cls, _model().parameters(), path=str(tmp_path), lr=0.01,
                           state_dtype=torch.float32)
    opt.close()


@pytest.mark.parametrize("bad", [torch.float16, "fp16", 2])
def test_bad_state_dtypes_are_refused_naming_them(bad, tmp_path):
    with pytest.raises(ValueError, match="state_dtype must be torch.float32 or torch.bfloat16"
                                         r" \(the state tensors' dtype in the store\), got "
                                         + repr(bad).replace(".", r"\.")):
        OffloadOptimizer(torch.optim.Adam, _model().parameters(), path=str(tmp_path),
                         state_dtype=bad)


def test_an_update_rule_with_bf16_states_rounds_them_after_every_step(tmp_path):
    def update(p, g, state, step, group):
        buf = state["buf"]
        buf.mul_(group["beta"]).add_(g)
        p.add_(buf, alpha=-group["lr"])

    rule = UpdateRule("heavy_ball", update, states=("buf",), defaults=dict(lr=0.05, beta=0.9))
    m_ref, m_off = _model(), _model()
    bufs = [torch.zeros_like(p) for p in m_ref.parameters()]
    off = OffloadOptimizer(rule, m_off.parameters(), path=str(tmp_path), tier="nvme",
                           sub_group_numel=256, chunk_size="64KiB", state_dtype="bf16")
    try:
        for x, y in _batches(4):
            _step(m_off, off, x, y)
            for p in m_ref.parameters():
                p.grad = None
            torch.nn.functional.cross_entropy(m_ref(x), y).backward()
            with torch.no_grad():
                for p, b in zip(m_ref.parameters(), bufs):
                    update(p, p.grad, {"buf": b}, 0, dict(lr=0.05, beta=0.9))
                    b.copy_(b.to(torch.bfloat16).to(torch.float32))
        for p, q, b in zip(m_ref.parameters(), m_off.parameters(), bufs):
            assert torch.equal(p, q)
            assert torch.equal(off.state[q]["buf"], b)
    finally:
        off.close()
