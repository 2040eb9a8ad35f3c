"""strata.torch.optim.OffloadOptimizer: every element-wise torch.optim class with its state
in the store, bit-identical (torch.equal) to the class in memory; state dicts both ways;
resume; refused classes; a failing rule rolled back."""
import pytest
import torch

import strata
from strata.torch.optim import OffloadOptimizer, RuleOptimizer, UpdateRule

# (class, constructor arguments = group 0, group 1's overrides): every option the issue
# names at least once (momentum/dampening/nesterov/maximize, centered, amsgrad, ...).
CLASSES = [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
     dict(lr=0.05, dampening=0.0, nesterov=True)),
    (torch.optim.SGD, dict(lr=0.1, maximize=True), dict(lr=0.2)),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1,
                               weight_decay=0.01), dict(lr=0.05)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9),
     dict(lr=0.02, weight_decay=0.01)),
    (torch.optim.Adadelta, dict(lr=1.0, rho=0.8, weight_decay=0.01), dict(lr=0.5)),
    (torch.optim.Adamax, dict(lr=0.01, weight_decay=0.01), dict(lr=0.02, betas=(0.8, 0.9))),
    (torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.005), dict(lr=0.02, weight_decay=0.01)),
    (torch.optim.RAdam, dict(lr=0.01), dict(lr=0.02, weight_decay=0.01)),
    (torch.optim.ASGD, dict(lr=0.01, t0=2, lambd=1e-3), dict(lr=0.02, weight_decay=0.01)),
    (torch.optim.Rprop, dict(lr=0.01, etas=(0.4, 1.3)), dict(lr=0.02, step_sizes=(1e-5, 1.0))),
    (torch.optim.Adam, dict(lr=0.01, amsgrad=True), dict(lr=0.02, weight_decay=0.01)),
    (torch.optim.AdamW, dict(lr=0.01), dict(lr=0.02, weight_decay=0.1)),
]
IDS = [f"{c.__name__}{i}" for i, (c, _, _) in enumerate(CLASSES)]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))


def _groups(model, g1):
    return [{"params": list(model[0].parameters())},
            {"params": list(model[2].parameters()), **g1}]


def _train(model, opt, steps, seed=1, sched=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def _assert_same(m1, o1, m2, o2):
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
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
    for g1, g2 in zip(s1["param_groups"], s2["param_groups"]):
        assert g1 == g2


def _offload(cls, model, g0, g1, tmp_path, tier="nvme", **kw):
    return OffloadOptimizer(cls, _groups(model, g1), path=str(tmp_path / "store"), tier=tier,
                            sub_group_numel=256, chunk_size="64KiB", **{**g0, **kw})


@pytest.mark.parametrize("tier", ["nvme", "host"])
@pytest.mark.parametrize("cls,g0,g1", CLASSES, ids=IDS)
def test_trains_bit_identical_with_a_scheduler(cls, g0, g1, tier, tmp_path):
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, g1), **g0)
    off = _offload(cls, m_off, g0, g1, tmp_path, tier)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, 2, gamma=0.5)
    s_off = torch.optim.lr_scheduler.StepLR(off, 2, gamma=0.5)
    _train(m_ref, ref, 5, sched=s_ref)
    _train(m_off, off, 5, sched=s_off)
    _assert_same(m_ref, ref, m_off, off)
    assert off.last_step["sub_groups"] >= (9 if tier == "nvme" else 0)
    off.close()


@pytest.mark.parametrize("cls,g0,g1", CLASSES, ids=IDS)
def test_state_dicts_load_both_ways(cls, g0, g1, tmp_path):
    # offloaded -> in memory
    m_off, m_ref = _model(), _model()
    off = _offload(cls, m_off, g0, g1, tmp_path)
    _train(m_off, off, 2)
    m_ref.load_state_dict(m_off.state_dict())
    ref = cls(_groups(m_ref, g1), **g0)
    ref.load_state_dict(off.state_dict())
    _train(m_off, off, 2, seed=2)
    _train(m_ref, ref, 2, seed=2)
    _assert_same(m_ref, ref, m_off, off)
    off.close()
    # in memory -> offloaded
    m_ref2, m_off2 = _model(), _model()
    ref2 = cls(_groups(m_ref2, g1), **g0)
    _train(m_ref2, ref2, 2)
    m_off2.load_state_dict(m_ref2.state_dict())
    off2 = OffloadOptimizer(cls, _groups(m_off2, g1), path=str(tmp_path / "s2"),
                            sub_group_numel=256, **g0)
    off2.load_state_dict(ref2.state_dict())
    _train(m_ref2, ref2, 2, seed=3)
    _train(m_off2, off2, 2, seed=3)
    _assert_same(m_ref2, ref2, m_off2, off2)
    off2.close()


@pytest.mark.parametrize("cls,g0,g1", [CLASSES[i] for i in (0, 6, 8, 9)],
                         ids=[IDS[i] for i in (0, 6, 8, 9)])
def test_checkpoint_resume_continues_bit_identical(cls, g0, g1, tmp_path):
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, g1), **g0)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, 1, gamma=0.7)
    off = _offload(cls, m_off, g0, g1, tmp_path)
    s_off = torch.optim.lr_scheduler.StepLR(off, 1, gamma=0.7)
    _train(m_ref, ref, 3, sched=s_ref)
    _train(m_off, off, 3, sched=s_off)
    off.checkpoint()
    off.close()
    m_new = _model(seed=5)  # other weights: the resume copies the masters in
    back = OffloadOptimizer(cls, _groups(m_new, {**g1, "lr": 123.0}),
                            path=str(tmp_path / "store"), resume=True, **g0)
    assert back.param_groups[0]["lr"] == ref.param_groups[0]["lr"]  # the checkpoint's
    assert back.param_groups[1]["lr"] == ref.param_groups[1]["lr"]
    _train(m_ref, ref, 2, seed=4)
    _train(m_new, back, 2, seed=4)
    _assert_same(m_ref, ref, m_new, back)
    back.close()


def test_refused_classes_and_sparse_gradients(tmp_path):
    m = _model()
    with pytest.raises(ValueError, match="LBFGS is refused: LBFGS is not element-wise"):
        OffloadOptimizer(torch.optim.LBFGS, m.parameters(), path=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="SparseAdam is refused: SparseAdam steps sparse"):
        OffloadOptimizer(torch.optim.SparseAdam, m.parameters(), path=str(tmp_path / "b"))
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer class"):
        OffloadOptimizer(object, m.parameters(), path=str(tmp_path / "c"))
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = OffloadOptimizer(torch.optim.SGD, emb.parameters(), lr=0.1, path=str(tmp_path / "d"))
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="parameter 0 has a sparse gradient"):
        opt.step()
    opt.close()


def _failing_rule(fail):
    """SGD with momentum as a rule; raises once ``fail`` says so, after a partial write."""
    def update(param, grad, state, step, group):
        buf = state["buf"]
        if fail(step, param.numel()):
            param.add_(1000.0)
            buf.add_(1000.0)
            raise KeyError("no such thing")
        buf.mul_(group["momentum"]).add_(grad)
        param.add_(buf, alpha=-group["lr"])
    return UpdateRule("failing_sgd", update, ("buf",), dict(lr=0.1, momentum=0.9))


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_a_raising_rule_fails_the_step_and_rolls_it_back(tier, tmp_path):
    armed = {"on": False}
    calls = []

    def fail(step, n):
        calls.append(n)
        return armed["on"] and step == 2 and len(calls) > 3

    rule = _failing_rule(fail)
    m_off, m_ref = _model(), _model()
    off = OffloadOptimizer(rule, m_off.parameters(), path=str(tmp_path / "s"), tier=tier,
                           sub_group_numel=256, lr=0.05)
    ref = RuleOptimizer(_failing_rule(lambda s, n: False), m_ref.parameters(), lr=0.05)
    _train(m_off, off, 1)
    _train(m_ref, ref, 1)
    before = [p.detach().clone() for p in m_off.parameters()]
    sd_before = off.state_dict()
    armed["on"] = True
    calls.clear()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(9))
    off.zero_grad()
    m_off(x).square().mean().backward()
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"python update rule 'rule:failing_sgd' raised on parameter "
                             r"'p\d' \(elements \[\d+, \d+\), step 2\): KeyError: "
                             r"'no such thing'") as e:
        off.step()
    assert isinstance(e.value.__cause__, KeyError)
    assert "rolled back" in str(e.value)
    for a, b in zip(m_off.parameters(), before):
        assert torch.equal(a, b)
    sd_after = off.state_dict()
    for i in sd_before["state"]:
        assert sd_before["state"][i]["step"] == sd_after["state"][i]["step"] == 1
        assert torch.equal(sd_before["state"][i]["buf"], sd_after["state"][i]["buf"])
    # usable afterwards: the same training continues bit-identically to the rule in memory
    armed["on"] = False
    _train(m_off, off, 2, seed=3)
    _train(m_ref, ref, 2, seed=3)
    _assert_same(m_ref, ref, m_off, off)
    off.checkpoint()
    off.close()


def test_optimizer_state_reads_the_store(tmp_path):
    m_off, m_ref = _model(), _model()
    cls, g0, g1 = CLASSES[8]  # ASGD: scalars (step, eta, mu) and a state tensor (ax)
    off = _offload(cls, m_off, g0, g1, tmp_path)
    ref = cls(_groups(m_ref, g1), **g0)
    p0 = next(m_off.parameters())
    assert off.state[p0] == {} and len(off.state) == 0 and p0 not in off.state
    _train(m_off, off, 2)
    _train(m_ref, ref, 2)
    assert len(off.state) == 4 and p0 in off.state
    for p, q in zip(m_off.parameters(), m_ref.parameters()):
        mine, theirs = off.state[p], ref.state[q]
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    with pytest.raises(KeyError, match="not one of its parameters"):
        off.state[torch.zeros(3)]
    off.close()


def test_zero_size_parameters_step_as_in_memory(tmp_path):
    cls, g0, _ = CLASSES[6]  # NAdam: step and mu_product scalars
    w_off, w_ref = torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.zeros(0))
    m_off, m_ref = _model(), _model()
    off = OffloadOptimizer(cls, [w_off, *m_off.parameters()], path=str(tmp_path / "s"), **g0)
    ref = cls([w_ref, *m_ref.parameters()], **g0)
    for _ in range(2):
        for w in (w_off, w_ref):
            w.grad = torch.zeros(0)
    _train(m_off, off, 2)
    _train(m_ref, ref, 2)
    mine, theirs = off.state[w_off], ref.state[w_ref]
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    off.close()


def test_adagrad_state_before_the_first_step_is_torchs_and_interchangeable(tmp_path):
    # torch's Adagrad makes {step: 0, sum: initial_accumulator_value} at construction; a
    # parameter that has not stepped shows it too, and the state dict loads into torch.
    m_ref, m_off = _model(), _model()
    hp = dict(lr=0.05, initial_accumulator_value=0.25)
    ref = torch.optim.Adagrad(m_ref.parameters(), **hp)
    off = OffloadOptimizer(torch.optim.Adagrad, m_off.parameters(), path=str(tmp_path / "s"),
                           sub_group_numel=256, chunk_size="64KiB", **hp)
    p0 = next(m_off.parameters())
    assert off.state[p0].keys() == {"step", "sum"}
    assert torch.equal(off.state[p0]["sum"], torch.full(p0.shape, 0.25))
    _assert_same(m_ref, ref, m_off, off)
    into = torch.optim.Adagrad(m_ref.parameters(), **hp)
    into.load_state_dict(off.state_dict())
    _train(m_ref, into, 2)
    _train(m_off, off, 2)
    _assert_same(m_ref, into, m_off, off)
    off.close()


def test_a_parameter_listed_twice_and_add_param_group_after_close_are_refused(tmp_path):
    m = _model()
    w = m[0].weight
    with pytest.raises(ValueError, match=r"^OffloadOptimizer: parameter 1 is parameter 0 "
                                         r"again; torch.optim would step it twice"):
        OffloadOptimizer(torch.optim.SGD, [w, w], lr=0.1, path=str(tmp_path / "s"))
    off = OffloadOptimizer(torch.optim.SGD, [w], lr=0.1, path=str(tmp_path / "t"))
    off.close()
    with pytest.raises(strata.FailedPreconditionError, match="OffloadOptimizer is closed$"):
        off.add_param_group({"params": [m[2].weight]})


def test_a_resume_without_the_state_deciding_hyperparameters_says_what_to_pass(tmp_path):
    m = _model()
    off = OffloadOptimizer(torch.optim.SGD, m.parameters(), lr=0.1, momentum=0.9,
                           path=str(tmp_path / "s"), sub_group_numel=256, chunk_size="64KiB")
    _train(m, off, 1)
    off.close()
    with pytest.raises(strata.FailedPreconditionError,
                       match=r"^FailedPrecondition: OffloadOptimizer resume: the hyperparameters given make the "
                             r"state tensors \[\], not the checkpoint's: pass the ones that "
                             r"decide which state a parameter has \(e\.g\. SGD momentum"):
        OffloadOptimizer(torch.optim.SGD, _model().parameters(), lr=0.1,
                         path=str(tmp_path / "s"), resume=True)
