"""strata.torch.OffloadAdam/OffloadAdamW keep torch.optim's contract where users rely on it:
parameters changed outside the optimizer, param_groups edits, one optimizer per key
prefix, checkpoints of the current hyperparameters, optimizer.state, torch's keyword
arguments, state_dict numbering and loaded groups, betas set at step time.

Each test runs the same idiom with torch.optim.Adam/AdamW on the same data and asserts
bit-identical results (arithmetic="torch"), or the documented error."""
import pickle
import warnings

import pytest
import torch

import strata
import strata.torch as st

TIERS = ["host", "nvme"]


def _kw(tmp_path, tier, **kw):
    return dict(path=str(tmp_path / f"s-{tier}"), tier=tier, num_threads=1,
                arithmetic="torch", **kw)


def _linear(seed=0, dtype=torch.float32, n_in=4, n_out=3):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out).to(dtype)


def _set_grads(params, k):
    """Deterministic gradients for step k."""
    for i, p in enumerate(params):
        p.grad = (torch.linspace(-1.0, 1.0, p.numel()).view(p.shape) * (k + 1) * (i + 1)
                  + 0.1 * (i - k)).to(p.dtype)


def _both_step(pairs, k):
    """One step of each (params, optimizer) pair with step k's gradients."""
    for params, opt in pairs:
        _set_grads(params, k)
        opt.step()


def _assert_same(ps1, ps2):
    for a, b in zip(ps1, ps2):
        assert torch.equal(a.detach(), b.detach()), (a, b)


# ---- 1. parameters changed outside the optimizer ----------------------------------------

@pytest.mark.parametrize("tier", TIERS)
def test_model_load_state_dict_after_construction_is_stepped_from(tmp_path, tier):
    m1, m2 = _linear(), _linear()
    o1 = st.OffloadAdam(m1.parameters(), lr=0.01, **_kw(tmp_path, tier))
    o2 = torch.optim.Adam(m2.parameters(), lr=0.01)
    pretrained = {k: v + 5.0 for k, v in _linear(seed=7).state_dict().items()}
    m1.load_state_dict(pretrained)
    m2.load_state_dict(pretrained)
    for k in range(3):
        _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], k)
    _assert_same(m1.parameters(), m2.parameters())
    assert m1.weight.min() > 3.0  # stepped from the pretrained weights
    o1.close()


@pytest.mark.parametrize("tier", TIERS)
def test_clamp_and_data_assignment_after_each_step_follow_torch(tmp_path, tier):
    """WGAN weight clipping (p.clamp_ under no_grad), p.data = t, and p.data.clamp_ with
    mark_params_changed (in-place edits through .data bypass the version counter)."""
    m1, m2 = _linear(), _linear()
    o1 = st.OffloadAdam(m1.parameters(), lr=0.2, **_kw(tmp_path, tier))
    o2 = torch.optim.Adam(m2.parameters(), lr=0.2)
    for k in range(6):
        _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], k)
        for m in (m1, m2):
            if k % 3 == 0:
                with torch.no_grad():
                    for p in m.parameters():
                        p.clamp_(-0.05, 0.05)
            elif k % 3 == 1:
                m.weight.data = m.weight.data * 0.5 + 0.01
            else:
                for p in m.parameters():
                    p.data.clamp_(-0.02, 0.02)
        o1.mark_params_changed() if k % 3 == 2 else None
        _assert_same(m1.parameters(), m2.parameters())
    _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], 6)
    _assert_same(m1.parameters(), m2.parameters())
    o1.close()


@pytest.mark.parametrize("tier", TIERS)
def test_optimizer_load_state_dict_before_model_load_state_dict(tmp_path, tier):
    src, ref = _linear(seed=3), _linear(seed=3)
    o_src = torch.optim.Adam(src.parameters(), lr=0.05)
    for k in range(2):
        _set_grads(list(src.parameters()), k)
        o_src.step()
    sd, weights = o_src.state_dict(), src.state_dict()
    m1, m2 = _linear(), _linear()  # random init
    o1 = st.OffloadAdam(m1.parameters(), lr=0.05, **_kw(tmp_path, tier))
    o2 = torch.optim.Adam(m2.parameters(), lr=0.05)
    for o, m in ((o1, m1), (o2, m2)):
        o.load_state_dict(sd)
        m.load_state_dict(weights)
    for k in range(2, 4):
        _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], k)
    _assert_same(m1.parameters(), m2.parameters())
    o1.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_parameter_changed_outside_becomes_the_widened_master(tmp_path, dtype):
    m = _linear(dtype=dtype)
    o = st.OffloadAdam(m.parameters(), lr=0.01, **_kw(tmp_path, "nvme"))
    _set_grads(list(m.parameters()), 0)
    o.step()
    new = torch.full_like(m.weight, 0.3)  # not an fp32 value of the old master
    m.weight.data = new
    master = o.state_dict()["state"][0]["master_param"]
    assert torch.equal(master, new.float())
    o.close()


def test_unchanged_parameters_are_not_copied_into_the_masters(tmp_path):
    m = _linear()
    o = st.OffloadAdam(m.parameters(), lr=0.01, **_kw(tmp_path, "nvme"))
    writes = []
    real = o._opt.write_param
    o._opt.write_param = lambda *a: (writes.append(a[0]), real(*a))[1]
    for k in range(3):
        _set_grads(list(m.parameters()), k)
        o.step()
    assert writes == []
    with torch.no_grad():
        m.bias.add_(1.0)
    _set_grads(list(m.parameters()), 3)
    o.step()
    assert writes == [1]  # the bias only
    o.close()


# ---- 2. param_groups edits ----------------------------------------------------------------

@pytest.mark.parametrize("tier", TIERS)
def test_params_appended_to_a_group_and_groups_appended_directly_are_stepped(tmp_path, tier):
    m1, m2 = _linear(), _linear()
    x1, x2 = _linear(seed=5), _linear(seed=5)
    y1, y2 = _linear(seed=6), _linear(seed=6)
    o1 = st.OffloadAdamW(m1.parameters(), lr=0.01, **_kw(tmp_path, tier))
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.01)
    ps1, ps2 = list(m1.parameters()), list(m2.parameters())
    _both_step([(ps1, o1), (ps2, o2)], 0)
    for o, x, y in ((o1, x1, y1), (o2, x2, y2)):
        o.param_groups[0]["params"].append(x.weight)
        g = {k: v for k, v in o.param_groups[0].items() if k != "params"}
        o.param_groups.append(dict(g, params=[y.bias], lr=0.1))
    ps1 += [x1.weight, y1.bias]
    ps2 += [x2.weight, y2.bias]
    for k in range(1, 4):
        _both_step([(ps1, o1), (ps2, o2)], k)
    _assert_same(ps1, ps2)
    assert len(o1.state) == len(o2.state) == 4
    o1.close()


def test_param_groups_listing_a_parameter_twice_raises_naming_both_places(tmp_path):
    """Every edit of param_groups is followed (tests/bindings/torch_optim/
    test_torch_param_group_edits.py) except a parameter listed twice, which torch.optim
    would step twice, and a non-tensor entry: refused before anything is stepped."""
    m, other = _linear(), _linear(seed=9)
    o = st.OffloadAdam([{"params": [m.weight]}, {"params": [m.bias]}], lr=0.01,
                       **_kw(tmp_path, "nvme"))
    before = [p.detach().clone() for p in (m.weight, m.bias, other.weight)]
    for p in (m.weight, m.bias, other.weight):
        p.grad = torch.ones_like(p)
    for edit, error, msg in [
            (lambda: o.param_groups[1]["params"].append(m.weight), ValueError,
             r"param group 1, params\[1\]: a parameter listed twice in param_groups "
             r"\(also at param group 0, params\[0\]\)"),
            (lambda: o.param_groups[0]["params"].append(m.weight), ValueError,
             r"param group 0, params\[1\]: a parameter listed twice in param_groups "
             r"\(also at param group 0, params\[0\]\)"),
            (lambda: o.param_groups[0]["params"].insert(0, "w"), TypeError,
             r"param group 0, params\[0\] is a str")]:
        saved = [dict(g, params=list(g["params"])) for g in o.param_groups]
        edit()
        with pytest.raises(error, match=msg):
            o.step()
        o.param_groups[:] = saved
    _assert_same((m.weight, m.bias, other.weight), before)  # nothing stepped
    o.step()  # the original layout steps again
    assert not torch.equal(m.weight.detach(), before[0])
    o.close()


# ---- 3. one optimizer per key prefix and store --------------------------------------------

def test_two_optimizers_on_one_store_with_overlapping_prefixes_are_refused(store):
    a, b = _linear(), _linear(seed=1)
    o1 = st.OffloadAdam(a.parameters(), store=store, num_threads=1)
    for prefix in ("optim/", "optim/critic/", "opt"):
        with pytest.raises(strata.FailedPreconditionError) as e:
            st.OffloadAdam(b.parameters(), store=store, key_prefix=prefix, num_threads=1)
        assert "'optim/'" in str(e.value) and "key_prefix" in str(e.value)
    o2 = st.OffloadAdam(b.parameters(), store=store, key_prefix="critic/", num_threads=1)
    o1.checkpoint()
    with pytest.raises(strata.FailedPreconditionError):  # resume while o1 is open
        st.OffloadAdam(a.parameters(), store=store, resume=True, num_threads=1)
    o1.close()
    o3 = st.OffloadAdam(a.parameters(), store=store, resume=True, num_threads=1)
    o3.close()
    del o2  # garbage: its claim ends at once (no reference cycle keeps it)
    o4 = st.OffloadAdam(b.parameters(), store=store, key_prefix="critic/x/", num_threads=1)
    o4.close()


# ---- 4. checkpoint() records the current param_groups ------------------------------------

@pytest.mark.parametrize("tier", TIERS)
def test_checkpoint_records_hyperparameters_set_after_the_last_step(tmp_path, tier):
    m = _linear()
    kw = _kw(tmp_path, tier)
    o = st.OffloadAdam(m.parameters(), lr=1e-3, **kw)
    _set_grads(list(m.parameters()), 0)
    o.step()
    o.param_groups[0]["lr"] = 0.5  # e.g. a scheduler's step() after opt.step()
    o.param_groups[0]["betas"] = (0.8, 0.99)
    o.checkpoint()
    o.close()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = st.OffloadAdam(m.parameters(), lr=1e-3, resume=True, **kw)
    assert r.param_groups[0]["lr"] == 0.5
    assert r.param_groups[0]["betas"] == (0.8, 0.99)
    assert "lr=0.5 (constructor: 0.001)" in str(w[0].message)
    r.close()


# ---- optimizer.state -------------------------------------------------------------------

@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_optimizer_state_has_torchs_entries_and_writes_go_back(tmp_path, tier, amsgrad):
    m1, m2 = _linear(), _linear()
    frozen1, frozen2 = _linear(seed=4), _linear(seed=4)
    o1 = st.OffloadAdam(list(m1.parameters()) + [frozen1.bias], lr=0.01, amsgrad=amsgrad,
                        **_kw(tmp_path, tier))
    o2 = torch.optim.Adam(list(m2.parameters()) + [frozen2.bias], lr=0.01, amsgrad=amsgrad)
    ps1, ps2 = list(m1.parameters()), list(m2.parameters())
    for k in range(3):
        _both_step([(ps1, o1), (ps2, o2)], k)
    assert len(o1.state) == len(o2.state) == 2
    assert o1.state[frozen1.bias] == {} and len(o1.state) == 2
    assert frozen1.bias not in o1.state and ps1[0] in o1.state
    assert list(o1.state) == ps1
    for p1, p2 in zip(ps1, ps2):
        s1, s2 = o1.state[p1], o2.state[p2]
        assert sorted(s1) == sorted(s2)
        for k in s2:
            assert torch.equal(s1[k], s2[k]), k
            assert s1[k].dtype == s2[k].dtype and s1[k].shape == s2[k].shape
    # state surgery: in place, by assignment, and a restart by del, then more steps
    for o, ps in ((o1, ps1), (o2, ps2)):
        o.state[ps[0]]["exp_avg"].mul_(0.5)
        o.state[ps[1]]["exp_avg_sq"] = torch.ones_like(ps[1])
        del o.state[ps[1]]
        o.state[ps[0]]["step"] = torch.tensor(1.0)
    for k in range(3, 5):
        _both_step([(ps1, o1), (ps2, o2)], k)
    _assert_same(ps1, ps2)
    with pytest.raises(KeyError, match="momentum_buffer"):
        o1.state[ps1[0]]["momentum_buffer"] = torch.zeros(1)
    with pytest.raises(ValueError, match="elements"):
        o1.state[ps1[0]]["exp_avg"] = torch.zeros(2)
    # what torch.optim.Optimizer's own machinery does with state still works
    restored = pickle.loads(pickle.dumps(o1.state))  # a defaultdict of plain dicts
    assert len(restored) == 2
    for s1, p2 in zip(restored.values(), ps2):
        assert all(torch.equal(s1[k], o2.state[p2][k]) for k in o2.state[p2])
    assert "Parameter Group 0" in repr(o1)
    o1.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in ps1)
    o1.close()


def test_lr_scheduler_and_state_stay_torchs(tmp_path):
    m1, m2 = _linear(), _linear()
    o1 = st.OffloadAdamW(m1.parameters(), lr=0.1, **_kw(tmp_path, "nvme"))
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.1)
    s1 = torch.optim.lr_scheduler.OneCycleLR(o1, max_lr=0.1, total_steps=6)
    s2 = torch.optim.lr_scheduler.OneCycleLR(o2, max_lr=0.1, total_steps=6)
    ps1, ps2 = list(m1.parameters()), list(m2.parameters())
    for k in range(5):
        _both_step([(ps1, o1), (ps2, o2)], k)
        s1.step()
        s2.step()
    _assert_same(ps1, ps2)
    assert o1.param_groups[0]["betas"] == o2.param_groups[0]["betas"]
    o1.close()


# ---- torch's keyword arguments ----------------------------------------------------------

@pytest.mark.parametrize("ours,theirs", [(st.OffloadAdam, torch.optim.Adam),
                                         (st.OffloadAdamW, torch.optim.AdamW)])
def test_torch_keyword_arguments_are_accepted_as_torch_puts_them(tmp_path, ours, theirs):
    m1, m2 = _linear(), _linear()
    o1 = ours(m1.parameters(), lr=0.01, foreach=True, capturable=False, **_kw(tmp_path, "host"))
    o2 = theirs(m2.parameters(), lr=0.01, foreach=True, capturable=False)
    assert list(o1.defaults.items()) == list(o2.defaults.items())
    assert [k for k in o1.param_groups[0]] == [k for k in o2.param_groups[0]]
    for k in range(3):
        _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], k)
    _assert_same(m1.parameters(), m2.parameters())
    o1.zero_grad()  # foreach zero_grad of torch's base class
    for flag in ("capturable",) + (("differentiable", "fused") if ours is st.OffloadAdam
                                   else ()):
        with pytest.raises(ValueError, match=f"{flag}=True"):
            ours(_linear().parameters(), **{flag: True}, **_kw(tmp_path, "host"))
    o1.param_groups[0]["capturable"] = True
    with pytest.raises(ValueError, match="param group 0: capturable=True"):
        o1.step()
    o1.close()
    if ours is st.OffloadAdamW:  # as torch.optim.AdamW of torch 1.13
        for flag in ("differentiable", "fused"):
            with pytest.raises(TypeError):
                theirs(_linear().parameters(), **{flag: False})
            with pytest.raises(TypeError, match=flag):
                ours(_linear().parameters(), **{flag: False}, **_kw(tmp_path, "host"))


# ---- state_dict ids, loaded groups ------------------------------------------------------

def test_state_dict_numbers_parameters_by_identity_as_torch(tmp_path):
    m1, m2 = _linear(), _linear()
    o1 = st.OffloadAdam(m1.parameters(), lr=0.01, **_kw(tmp_path, "host"))
    o2 = torch.optim.Adam(m2.parameters(), lr=0.01)
    _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], 0)
    for o in (o1, o2):
        o.param_groups.append(o.param_groups[0])  # the same group listed twice
    sd1, sd2 = o1.state_dict(), o2.state_dict()
    assert [g["params"] for g in sd1["param_groups"]] == [[0, 1], [0, 1]]
    assert [g["params"] for g in sd1["param_groups"]] == [g["params"] for g in sd2["param_groups"]]
    assert sorted(sd1["state"]) == sorted(sd2["state"])
    with pytest.raises(ValueError, match="listed twice"):
        o1.step()
    o1.close()


@pytest.mark.parametrize("tier", TIERS)
def test_loaded_group_without_a_key_takes_torchs_default(tmp_path, tier):
    src = _linear(seed=2)
    o_src = torch.optim.Adam(src.parameters(), lr=0.05)
    _set_grads(list(src.parameters()), 0)
    o_src.step()
    sd = o_src.state_dict()
    for g in sd["param_groups"]:  # an older checkpoint: no maximize, foreach, ...
        for k in ("maximize", "foreach", "capturable", "differentiable", "fused"):
            del g[k]
        g["initial_lr"] = 0.05
    m1, m2 = _linear(), _linear()
    o1 = st.OffloadAdam(m1.parameters(), lr=0.01, maximize=True, **_kw(tmp_path, tier))
    o2 = torch.optim.Adam(m2.parameters(), lr=0.01, maximize=True)
    o1.param_groups[0]["scheduler_key"] = 1  # only ours: dropped as torch drops it
    o1.load_state_dict(sd)
    o2.load_state_dict(sd)
    assert o1.param_groups[0]["maximize"] is False
    assert {k: v for k, v in o1.param_groups[0].items() if k != "params"} == \
        {k: v for k, v in o2.param_groups[0].items() if k != "params"}
    for k in range(1, 3):
        _both_step([(list(m1.parameters()), o1), (list(m2.parameters()), o2)], k)
    _assert_same(m1.parameters(), m2.parameters())
    del sd["param_groups"][0]["lr"]
    with pytest.raises(ValueError, match="loaded param group 0: has no 'lr'"):
        o1.load_state_dict(sd)
    o1.close()


# ---- betas set at step time -------------------------------------------------------------

@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("ours,theirs", [(st.OffloadAdam, torch.optim.Adam),
                                         (st.OffloadAdamW, torch.optim.AdamW)])
def test_betas_outside_the_constructor_range_step_as_torch(tmp_path, tier, ours, theirs):
    m1, m2 = _linear(), _linear()
    o1 = ours(m1.parameters(), lr=0.01, amsgrad=True, **_kw(tmp_path, tier))
    o2 = theirs(m2.parameters(), lr=0.01, amsgrad=True)
    ps1, ps2 = list(m1.parameters()), list(m2.parameters())
    schedule = [(0.95, 0.999), (1.05, 0.999), (1.1, 0.99), (-0.2, -0.5), (0.9, 0.999)]
    for k, betas in enumerate(schedule):
        for o in (o1, o2):
            o.param_groups[0]["betas"] = betas
        _both_step([(ps1, o1), (ps2, o2)], k)
        _assert_same(ps1, ps2)
    for o in (o1, o2):
        o.param_groups[0]["betas"] = (1.0, 0.999)
    for ps, o in ((ps1, o1), (ps2, o2)):
        _set_grads(ps, 9)
        with pytest.raises(ZeroDivisionError):
            o.step()
    for o in (o1, o2):
        o.param_groups[0]["betas"] = (0.9, 1.05)
    for ps, o in ((ps1, o1), (ps2, o2)):
        with pytest.raises(ValueError, match="math domain error"):
            o.step()
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.05"):
        ours(_linear().parameters(), betas=(1.05, 0.999), **_kw(tmp_path, "host"))
    o1.close()


@pytest.mark.parametrize("tier", TIERS)
def test_close_keeps_parameters_changed_outside_and_state_edits(tmp_path, tier):
    """close() is a checkpoint: it holds a model.load_state_dict made after the last step
    and an edit of optimizer.state, as checkpoint() does."""
    m = _linear()
    kw = _kw(tmp_path, tier)
    o = st.OffloadAdam(m.parameters(), lr=0.01, **kw)
    _set_grads(list(m.parameters()), 0)
    o.step()
    o.checkpoint()
    pretrained = {k: v + 5.0 for k, v in _linear(seed=7).state_dict().items()}
    m.load_state_dict(pretrained)
    o.state[m.weight]["exp_avg"].fill_(0.25)
    o.close()
    fresh = _linear(seed=11)
    r = st.OffloadAdam(fresh.parameters(), lr=0.01, resume=True, **kw)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, pretrained[k]), k
    assert torch.equal(r.state[fresh.weight]["exp_avg"], torch.full_like(fresh.weight, 0.25))
    r.close()


@pytest.mark.parametrize("make", ["OffloadAdamW", "OffloadOptimizer"])
@pytest.mark.parametrize("how", ["copy", "deepcopy"])
def test_copies_are_refused_saying_how_to_get_a_second_optimizer(tmp_path, make, how):
    import copy
    model = _linear()
    if make == "OffloadAdamW":
        opt = st.OffloadAdamW(model.parameters(), lr=0.1, path=str(tmp_path / "s"))
    else:
        opt = st.optim.OffloadOptimizer(torch.optim.SGD, model.parameters(), lr=0.1,
                                        path=str(tmp_path / "s"))
    _set_grads(list(model.parameters()), 0)
    opt.step()
    with pytest.raises(TypeError) as e:
        getattr(copy, how)(opt)
    assert str(e.value) == (
        f"{make} cannot be copied: its state lives in strata's store, which a copy would "
        f"share; make another {make} over the parameters (its own store or key_prefix) and "
        "load_state_dict(opt.state_dict()) into it")
    # the optimizer is untouched: another step and a state dict still work
    _set_grads(list(model.parameters()), 1)
    opt.step()
    assert opt.state_dict()["state"][0]
    opt.close()
