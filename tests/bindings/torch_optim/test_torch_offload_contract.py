"""strata.torch.OffloadAdam/OffloadAdamW: resume hyperparameters, atomic load_state_dict,
parameter dtypes, cleanup on constructor failure, use after close (tiny models, exact values).

Exact comparisons use arithmetic="torch" (torch.optim's rounding, bit-identical)."""
import os
import warnings

import pytest
import torch

import strata
import strata.torch as st

KW = dict(num_threads=1, arithmetic="torch")


def _linear(n_in=3, n_out=2, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out)


def _set_grads(model, k):
    """Deterministic gradients for step k: linspace(-1, 1) * (k + 1) * (index + 1)."""
    for i, p in enumerate(model.parameters()):
        p.grad = torch.linspace(-1.0, 1.0, p.numel()).view(p.shape) * (k + 1) * (i + 1)


def _step(model, opt, k):
    _set_grads(model, k)
    opt.step()


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _assert_same(m1, m2):
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.detach(), b.detach())


# ---- 1. hyperparameters after resume ----------------------------------------------------

def test_resume_takes_checkpoint_hyperparams_warns_and_later_edits_apply(tmp_path):
    path = str(tmp_path / "ckpt")
    m = _linear()
    ref = _linear()
    o = st.OffloadAdamW(m.parameters(), lr=0.01, path=path, **KW)
    o_ref = torch.optim.AdamW(ref.parameters(), lr=0.01)
    _step(m, o, 0)
    _step(ref, o_ref, 0)
    o.checkpoint()
    o.close()

    with pytest.warns(UserWarning) as rec:
        o2 = st.OffloadAdamW(m.parameters(), lr=0.5, betas=(0.8, 0.999), path=path,
                             resume=True, **KW)
    assert [str(w.message) for w in rec] == [
        "OffloadAdamW(resume=True): param group 0 takes the checkpoint's lr=0.01 "
        "(constructor: 0.5), betas=(0.9, 0.999) (constructor: (0.8, 0.999)); set "
        "param_groups to change them"]
    g = o2.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (0.01, (0.9, 0.999), 0.01)
    _step(m, o2, 1)  # steps with the checkpoint's lr, like the uninterrupted run
    _step(ref, o_ref, 1)
    _assert_same(m, ref)
    o2.param_groups[0]["lr"] = 0.5  # an edit after resume takes effect
    o_ref.param_groups[0]["lr"] = 0.5
    _step(m, o2, 2)
    _step(ref, o_ref, 2)
    _assert_same(m, ref)
    assert o2.state_dict()["state"][0]["step"].item() == 3.0
    o2.close()


def test_resume_with_same_hyperparams_does_not_warn(tmp_path):
    path = str(tmp_path / "ckpt")
    m = _linear()
    o = st.OffloadAdam(m.parameters(), lr=0.02, path=path, **KW)
    o.checkpoint()
    o.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o2 = st.OffloadAdam(m.parameters(), lr=0.02, path=path, resume=True, **KW)
    assert o2.param_groups[0]["lr"] == 0.02
    o2.close()


def _two_layers():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)


def test_resume_refuses_other_group_layout_and_fewer_params(tmp_path):
    path = str(tmp_path / "ckpt")
    a, b = _two_layers()
    o = st.OffloadAdamW([{"params": a.parameters(), "lr": 0.01},
                         {"params": b.parameters(), "lr": 0.02}], path=path, **KW)
    o.checkpoint()
    o.close()
    params = list(a.parameters()) + list(b.parameters())

    with pytest.raises(ValueError) as e:  # two strata groups under one torch group
        st.OffloadAdamW(params, path=path, resume=True, **KW)
    assert str(e.value) == ("the checkpoint under 'optim/' has 2 param group(s), the "
                            "optimizer was given 1; give the parameters in the "
                            "checkpoint's groups")

    with pytest.raises(ValueError) as e:
        st.OffloadAdamW([{"params": params[:1]}, {"params": params[1:3]}], path=path,
                        resume=True, **KW)
    assert str(e.value) == "the checkpoint under 'optim/' holds 4 parameters, the model gives 3"

    c, d = _two_layers()
    for p in list(c.parameters()) + list(d.parameters()):
        p.data.fill_(5.0)
    moved = list(c.parameters()) + list(d.parameters())
    with pytest.raises(ValueError) as e:  # same counts, p1 moved into the second group
        st.OffloadAdamW([{"params": moved[:1]}, {"params": moved[1:]}], path=path,
                        resume=True, **KW)
    assert str(e.value) == ("checkpointed parameter p1 is in param group 0, the model "
                            "gives it in group 1")
    assert all(torch.equal(p.detach(), torch.full_like(p, 5.0)) for p in moved)  # untouched


# ---- 2. load_state_dict: sizes, atomicity -----------------------------------------------

def _state_dict_after_step(tmp_path, name, model):
    o = st.OffloadAdam(model.parameters(), lr=0.01, path=str(tmp_path / name), **KW)
    _step(model, o, 0)
    sd = o.state_dict()
    o.close()
    return sd


def test_load_state_dict_checks_sizes_and_is_atomic(tmp_path):
    good = _state_dict_after_step(tmp_path, "src", _linear())
    m, twin = _linear(), _linear()
    o = st.OffloadAdam(m.parameters(), lr=0.01, path=str(tmp_path / "a"), **KW)
    o_twin = st.OffloadAdam(twin.parameters(), lr=0.01, path=str(tmp_path / "b"), **KW)
    _step(m, o, 0)
    _step(twin, o_twin, 0)

    def bad(**changes):
        sd = {"state": {i: dict(s) for i, s in good["state"].items()},
              "param_groups": [dict(g) for g in good["param_groups"]]}
        for k, v in changes.items():
            if k in ("lr", "amsgrad"):
                sd["param_groups"][0][k] = v
            else:
                sd["state"][0][k] = v
        sd["state"][1]["exp_avg"] = torch.full((2,), 9.0)  # valid, so a partial load shows
        return sd

    cases = [
        (bad(exp_avg=torch.full((4,), 7.0)),
         "loaded state of parameter 0: 'exp_avg' has 4 elements, the parameter has 6"),
        (bad(exp_avg_sq=torch.zeros(7)),
         "loaded state of parameter 0: 'exp_avg_sq' has 7 elements, the parameter has 6"),
        (bad(lr=-1.0), "loaded param group 0: Invalid learning rate: -1.0"),
        (bad(amsgrad=True), "loaded param group 0: amsgrad=True, but this optimizer's state "
                            "streams were made with amsgrad=False"),
        (bad(step=torch.tensor(-2.0)),
         "loaded state of parameter 0: step -2.0 is not an integer >= 0"),
    ]
    for sd, msg in cases:
        with pytest.raises(ValueError) as e:
            o.load_state_dict(sd)
        assert str(e.value) == msg
    assert o.param_groups[0]["lr"] == 0.01 and o.param_groups[0]["amsgrad"] is False
    for k in range(1, 3):  # the refused loads changed nothing
        _step(m, o, k)
        _step(twin, o_twin, k)
    _assert_same(m, twin)
    s1, s2 = o.state_dict()["state"], o_twin.state_dict()["state"]
    for i in (0, 1):
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1[i][k], s2[i][k])
    o.close()
    o_twin.close()


def test_load_state_dict_of_another_layer_size_is_refused(tmp_path):
    sd = _state_dict_after_step(tmp_path, "src", _linear(5, 3))
    m = _linear(5, 4)
    before = _params(m)
    o = st.OffloadAdam(m.parameters(), lr=0.01, path=str(tmp_path / "a"), **KW)
    with pytest.raises(ValueError) as e:
        o.load_state_dict(sd)
    assert str(e.value) == ("loaded state of parameter 0: 'exp_avg' has 15 elements, the "
                            "parameter has 20")
    assert o.state_dict()["state"] == {}
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, m.parameters()))
    o.close()


# ---- 3. parameter dtypes ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_unsupported_param_dtypes_are_refused(strata_dir, dtype):
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, dtype=dtype))]
    with pytest.raises(ValueError) as e:
        st.OffloadAdamW(params, lr=0.01, **KW)
    assert str(e.value) == (
        f"parameter 1 has dtype {dtype}; strata offloaded optimizers support torch.float32, "
        "torch.float16 and torch.bfloat16 parameters (fp32 masters would round float64; "
        "complex is not supported)")
    assert os.listdir(strata_dir) == []


def test_add_param_group_refuses_float64_before_adding(strata_dir):
    m = _linear()
    o = st.OffloadAdam(m.parameters(), lr=0.01, **KW)
    with pytest.raises(ValueError) as e:
        o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]})
    assert str(e.value).startswith("parameter 2 has dtype torch.float64; ")
    with pytest.raises(ValueError) as e:
        o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": -0.5})
    assert str(e.value) == "param group 1: Invalid learning rate: -0.5"
    assert len(o.param_groups) == 1 and o._opt.num_param_groups() == 1
    w = torch.nn.Parameter(torch.ones(2))  # a valid group still works afterwards
    o.add_param_group({"params": [w], "lr": 0.5})
    w.grad = torch.tensor([1.0, -1.0])
    for p in m.parameters():
        p.grad = None
    o.step()
    w_ref = torch.nn.Parameter(torch.ones(2))
    w_ref.grad = torch.tensor([1.0, -1.0])
    torch.optim.Adam([w_ref], lr=0.5).step()
    assert torch.equal(w.detach(), w_ref.detach())
    assert w.detach().tolist() == [0.5000000596046448, 1.5]
    o.close()


# ---- 4./5. cleanup: constructor failures, close() -----------------------------------------

def test_failed_store_open_leaves_nothing_and_close_is_safe(strata_dir):
    with pytest.raises(strata.InvalidArgumentError) as e:
        st.OffloadAdamW(_linear().parameters(), chunk_size=0, **KW)
    assert "chunk_bytes 0" in str(e.value)
    assert os.listdir(strata_dir) == []
    half = st.OffloadAdamW.__new__(st.OffloadAdamW)  # no attribute set at all
    half.close()
    half.close()
    o = st.OffloadAdamW(_linear().parameters(), **KW)
    (owned,) = os.listdir(strata_dir)
    assert owned.startswith("optim-")
    o.close()
    o.close()
    assert os.listdir(strata_dir) == []


def test_resume_without_checkpoint_creates_nothing(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(strata.NotFoundError) as e:
        st.OffloadAdam(_linear().parameters(), path=str(missing), resume=True, **KW)
    assert str(e.value) == f"NotFound: no store at {missing}"
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(strata.NotFoundError):
        st.OffloadAdam(_linear().parameters(), path=str(empty), resume=True, **KW)
    assert os.listdir(empty) == []
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_linear().parameters(), resume=True, **KW)
    assert str(e.value) == "resume=True needs the store or path of the checkpoint"


def test_resume_from_store_without_checkpoint_adds_nothing(tmp_path):
    path = tmp_path / "store"
    strata.Store.open(str(path), chunk_size="1MiB", host_budget="16MiB",
                      staging="16MiB").close()
    before = sorted(os.listdir(path))
    with pytest.raises(strata.NotFoundError):
        st.OffloadAdam(_linear().parameters(), path=str(path), resume=True, **KW)
    assert sorted(os.listdir(path)) == before
    s = strata.Store.open(str(path), create=False, host_budget="16MiB", staging="16MiB")
    assert s.keys() == []
    s.close()


# ---- 6. use after close, bad pipeline arguments -----------------------------------------

def test_methods_after_close_raise_failed_precondition(tmp_path):
    m = _linear()
    o = st.OffloadAdamW(m.parameters(), path=str(tmp_path / "s"), **KW)
    _step(m, o, 0)
    sd = o.state_dict()
    o.close()
    calls = [o.step, o.checkpoint, o.state_dict, lambda: o.load_state_dict(sd),
             lambda: o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})]
    for call in calls:
        with pytest.raises(strata.FailedPreconditionError) as e:
            call()
        assert str(e.value) == "FailedPrecondition: OffloadAdamW is closed"


@pytest.mark.parametrize("arg,value,msg", [
    ("sub_group_numel", -1, "sub_group_numel must be an int >= 0, got -1"),
    ("num_buffers", -2, "num_buffers must be an int >= 0, got -2"),
    ("num_threads", "2", "num_threads must be an int >= 0, got str '2'"),
    ("sub_group_numel", 1.5, "sub_group_numel must be an int >= 0, got float 1.5"),
    ("max_grad_norm", -1.0, "max_grad_norm must be >= 0 (0 = no clipping), got -1.0"),
])
def test_bad_pipeline_arguments_raise_value_error(strata_dir, arg, value, msg):
    kw = dict(KW, **{arg: value})
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_linear().parameters(), **kw)
    assert str(e.value) == msg
    assert os.listdir(strata_dir) == []
