"""Regression tests of defects found in the Python bindings (one test per defect)."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import strata
import strata.torch as st


# ---- 1. no crash at interpreter exit when numpy was used but torch never imported --------

def test_exit_after_numpy_use_without_torch_is_clean(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import strata
        s = strata.Store.open({str(tmp_path / 'store')!r}, host_budget="16MiB",
                              staging="4MiB", chunk_size="1MiB", workers=1)
        s.put("x", np.ones(3))
        a = s.get("x")
        s.close()
        assert "torch" not in sys.modules, "the scenario needs torch unimported"
        print(a.tolist())
    """)
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[1.0, 1.0, 1.0]\n"


# ---- 2. foreign byte order is refused, not stored raw ------------------------------------

def test_big_endian_arrays_are_refused(store):
    assert sys.byteorder == "little"
    with pytest.raises(strata.InvalidArgumentError) as e:
        store.put("be", np.arange(4, dtype=">f4"))
    assert isinstance(e.value, ValueError)
    assert "big-endian" in e.value.message
    assert "newbyteorder" in e.value.message
    assert "be" not in store
    with pytest.raises(strata.InvalidArgumentError):  # also under a dtype override
        store.put("be16", np.arange(4, dtype=">u2"), dtype="bf16")
    with pytest.raises(strata.InvalidArgumentError):  # and as a get_into target
        store.put("le", np.arange(4, dtype="<f4"))
        store._s.get_into("le", np.zeros(4, dtype=">f4"), None)
    # Explicit little-endian (native here) and 1-byte types with any prefix are fine.
    assert store.get("le").tolist() == [0.0, 1.0, 2.0, 3.0]
    store.put("u8", np.arange(4, dtype=">u1"))
    assert store.get("u8").tolist() == [0, 1, 2, 3]
    # The documented conversion works.
    a = np.arange(4, dtype=">f4")
    store.put("conv", a.astype(a.dtype.newbyteorder("=")))
    assert store.get("conv").tolist() == [0.0, 1.0, 2.0, 3.0]


# ---- 3. Future.result timeouts: inf / huge wait, nan / negative are ValueError -----------

def test_future_result_timeout_values(store):
    store.put("t", np.arange(5, dtype=np.int32))
    for timeout in (float("inf"), 1e300, 1e9, 3600.0):
        assert store.get_async("t").result(timeout=timeout).tolist() == [0, 1, 2, 3, 4]
    f = store.get_async("t")
    for bad in (float("nan"), -1.0, float("-inf")):
        with pytest.raises(strata.InvalidArgumentError) as e:
            f.result(timeout=bad)
        assert isinstance(e.value, ValueError)
        assert "timeout" in e.value.message
    assert f.result().tolist() == [0, 1, 2, 3, 4]  # the future is still usable


# ---- 4. every failure is a strata.Error naming the cause ---------------------------------

def test_torch_bool_tensors_round_trip(store):
    t = torch.tensor([[True, False, True], [False, False, True]])
    store.put("b", t)
    assert store.stat("b").dtype == "bool"
    got = store.get("b")
    assert got.dtype == np.bool_
    assert got.tolist() == [[True, False, True], [False, False, True]]
    out = torch.zeros(2, 3, dtype=torch.bool)
    assert store.get_into("b", out) is out
    assert out.tolist() == [[True, False, True], [False, False, True]]
    fut = store.get_into_async("b", torch.ones(2, 3, dtype=torch.bool))
    assert fut.result().tolist() == [[True, False, True], [False, False, True]]
    store.put("np_b", np.array([True, False]))
    assert store.get("np_b").tolist() == [True, False]


def test_unexportable_tensors_are_value_errors_naming_why(store):
    cases = [
        (torch.zeros(3, dtype=torch.complex64).conj(), "conjugate bit"),
        (torch.zeros(3).to_sparse(), "layout torch.sparse_coo"),
        (torch.empty(3, device="meta"), "'meta' device"),
        (torch.zeros(3)._neg_view(), "negative bit"),
    ]
    for i, (t, why) in enumerate(cases):
        with pytest.raises(strata.InvalidArgumentError) as e:
            store.put(f"t{i}", t)
        assert isinstance(e.value, ValueError)
        assert why in e.value.message, e.value.message
        assert f"t{i}" not in store


def test_out_of_range_store_options_are_value_errors(tmp_path):
    path = str(tmp_path / "s")
    for workers in (100000, 1025, 0):
        with pytest.raises(strata.InvalidArgumentError) as e:
            strata.Store.open(path, workers=workers)
        assert e.value.message == f"workers must be in [1, 1024], got {workers}"
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.Store.open(path, host_budget=2**70)
    assert e.value.message == ("host_budget = 1180591620717411303424 does not fit in 64 bits "
                               "(max 2**64-1 bytes)")
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.Store.open(path, staging=-1)
    assert e.value.message == "staging must be >= 0, got -1"


def test_non_numeric_hyperparameters_are_value_errors(store):
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.OffloadedOptimizer.create(store, "adamw", {"lr": "x"})
    assert isinstance(e.value, ValueError)
    assert e.value.message == ("hyperparameter 'lr' must be a number (int, float or bool), "
                               "got str 'x'")
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.OffloadedOptimizer.create(store, "adamw", {"eps": 10**400})
    assert "hyperparameter 'eps'" in e.value.message
    # numpy scalars and ints are numbers.
    o = strata.OffloadedOptimizer.create(store, "adamw", {"lr": np.float32(0.5),
                                                          "weight_decay": 0})
    assert o.hyperparams(0)["lr"] == 0.5
    assert o.hyperparams(0)["weight_decay"] == 0.0
    with pytest.raises(strata.InvalidArgumentError):
        o.set_hyperparams(0, {"lr": None})
    o.close()


# ---- 5. zero-size parameters are accepted like torch.optim -------------------------------

def _same_grads(gen, params_a, params_b):
    """Gives each pair (params_a[i], params_b[i]) the same random gradient from `gen`."""
    for pa, pb in zip(params_a, params_b):
        grad = torch.randn(pa.shape, generator=gen)
        pa.grad, pb.grad = grad.clone(), grad.clone()


def _assert_bit_identical(params_a, params_b):
    for pa, pb in zip(params_a, params_b):
        assert pa.shape == pb.shape
        assert torch.equal(pa.detach(), pb.detach())  # torch arithmetic: bit-identical


@pytest.mark.parametrize("ours,theirs", [(st.OffloadAdam, torch.optim.Adam),
                                         (st.OffloadAdamW, torch.optim.AdamW)])
def test_zero_size_parameters_like_torch(tmp_path, ours, theirs):
    torch.manual_seed(0)
    init = [torch.zeros(0), torch.randn(7), torch.zeros(2, 0), torch.randn(3, 2)]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    opt_a = ours(a, lr=1e-2, path=str(tmp_path / "s"), arithmetic="torch")
    opt_b = theirs(b, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        _same_grads(g, a, b)
        opt_a.step()
        opt_b.step()
    _assert_bit_identical(a, b)
    sd_a, sd_b = opt_a.state_dict(), opt_b.state_dict()
    assert sorted(sd_a["state"]) == sorted(sd_b["state"]) == [0, 1, 2, 3]
    assert sd_a["param_groups"][0]["params"] == sd_b["param_groups"][0]["params"] == [0, 1, 2, 3]
    for i in (0, 2):
        assert sd_a["state"][i]["step"].item() == 3.0
        assert sd_a["state"][i]["exp_avg"].shape == init[i].shape
        assert sd_a["state"][i]["exp_avg_sq"].shape == init[i].shape
    for i in (1, 3):
        assert torch.equal(sd_a["state"][i]["exp_avg"], sd_b["state"][i]["exp_avg"])
    # torch's state dict loads back (step counts of the empty parameters included).
    opt_a.load_state_dict(sd_b)
    assert opt_a.state_dict()["state"][0]["step"].item() == 3.0
    opt_b.load_state_dict(opt_a.state_dict())
    opt_a.close()


def test_only_zero_size_parameters(tmp_path):
    p = torch.nn.Parameter(torch.zeros(0))
    opt = st.OffloadAdamW([p], lr=1e-3, path=str(tmp_path / "s"))
    p.grad = torch.zeros(0)
    opt.step()
    assert opt.state_dict()["state"][0]["step"].item() == 1.0
    assert p.shape == (0,)
    opt.close()


def test_zero_size_gradient_without_an_address_attaches(store):
    """An empty torch tensor has data_ptr() 0; for a zero-size parameter set_grad still
    attaches it (only None detaches), so the optimizer counts the step."""
    o = strata.OffloadedOptimizer.create(store, "adamw", {"lr": 0.1})
    h = o.add_param("z", 0, torch.zeros(0))
    g = torch.zeros(0)
    assert g.data_ptr() == 0
    o.set_grad(h, g)
    o.set_param_copy(h, torch.zeros(0, dtype=torch.bfloat16))
    assert o.param_info(h)["has_grad"]
    assert o.step()["tensors_updated"] == 1
    assert o.step_count(h) == 1
    o.set_grad(h, None)
    assert not o.param_info(h)["has_grad"]
    assert o.step()["tensors_updated"] == 0
    assert o.step_count(h) == 1
    with pytest.raises(strata.InvalidArgumentError):
        o.set_grad(h, torch.zeros(1))  # the element count is still checked
    o.close()


def _step_both(g, ours, twin, opt, ref, steps):
    for _ in range(steps):
        _same_grads(g, ours, twin)
        opt.step()
        ref.step()


def _assert_steps_and_moments_match(sd, sd_ref, n_params):
    """state dicts of ours and torch's: the same step counts (zero-size parameters too), and
    bit-identical moments."""
    assert sorted(sd["state"]) == sorted(sd_ref["state"]) == list(range(n_params))
    for i in range(n_params):
        assert sd["state"][i]["step"].item() == sd_ref["state"][i]["step"].item()
        for k in ("exp_avg", "exp_avg_sq"):
            assert sd["state"][i][k].shape == sd_ref["state"][i][k].shape
            assert torch.equal(sd["state"][i][k], sd_ref["state"][i][k])


@pytest.mark.parametrize("tier", ["nvme", "host"])
@pytest.mark.parametrize("ours_cls,theirs_cls", [(st.OffloadAdam, torch.optim.Adam),
                                                 (st.OffloadAdamW, torch.optim.AdamW)])
def test_zero_size_step_counts_survive_checkpoint_and_resume(tmp_path, tier, ours_cls,
                                                             theirs_cls):
    """checkpoint() keeps the step counts of zero-size parameters (strata's optimizer holds
    them, in its one commit: no other object is written); a resumed optimizer reports them
    and keeps matching torch.optim bit for bit."""
    path = str(tmp_path / "s")
    torch.manual_seed(0)
    init = [torch.randn(5), torch.zeros(0), torch.randn(2, 3), torch.zeros(3, 0)]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    twin = [torch.nn.Parameter(t.clone()) for t in init]
    g = torch.Generator().manual_seed(2)
    opt = ours_cls(ours, lr=1e-2, path=path, tier=tier, arithmetic="torch")
    ref = theirs_cls(twin, lr=1e-2)
    _step_both(g, ours, twin, opt, ref, 3)
    opt.checkpoint()
    opt.close()
    with strata.Store.open(path, host_budget="16MiB", staging="4MiB", workers=1) as s:
        assert "optim/torch/empty_steps" not in s
        assert not [k for k in s.keys() if k.startswith("optim/torch/")]

    again = [torch.nn.Parameter(torch.full_like(t, 7.0)) for t in init]  # resume overwrites
    opt2 = ours_cls(again, lr=1e-2, path=path, tier=tier, arithmetic="torch", resume=True)
    sd = opt2.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    for i in range(4):
        assert sd["state"][i]["step"].item() == ref.state_dict()["state"][i]["step"].item()
        assert sd["state"][i]["step"].item() == 3.0
    assert sd["state"][1]["exp_avg"].shape == (0,)
    assert sd["state"][3]["exp_avg_sq"].shape == (3, 0)
    for pa, pb in zip(again, twin):
        assert torch.equal(pa.detach(), pb.detach())
    _step_both(g, again, twin, opt2, ref, 3)
    _assert_bit_identical(again, twin)
    sd, sd_ref = opt2.state_dict(), ref.state_dict()
    for i in range(4):
        assert sd["state"][i]["step"].item() == sd_ref["state"][i]["step"].item() == 6.0
    _assert_steps_and_moments_match(sd, sd_ref, 4)
    opt2.close()
    with strata.Store.open(path, host_budget="16MiB", staging="4MiB", workers=1) as s:
        assert "optim/torch/empty_steps" not in s


def _checkpointed_hp(weight_decay):
    """The hyperparameters OffloadAdam(W)(lr=1e-2) gives strata (what a resume adopts)."""
    return dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=weight_decay,
                amsgrad=0.0, maximize=0.0)


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_resume_of_a_checkpoint_with_separate_zero_size_step_counts(tmp_path, tier):
    """A store written by the earlier version, whose optimizer did not hold zero-size
    parameters: their step counts were the int64 object ``optim/torch/empty_steps`` of
    shape (n, 2), rows (parameter index, step count), put before the optimizer's
    checkpoint, and the others were named by their index among all parameters (p0, p2).
    Resuming it turns each row into the parameter's step count, commits that once and
    deletes the object; the run stays bit-identical to torch.optim.AdamW, also across a
    second checkpoint and resume."""
    path = str(tmp_path / "s")
    torch.manual_seed(0)
    init = [torch.randn(5), torch.zeros(0), torch.randn(2, 3), torch.zeros(3, 0)]
    twin = [torch.nn.Parameter(t.clone()) for t in init]
    ref = torch.optim.AdamW(twin, lr=1e-2)
    g = torch.Generator().manual_seed(3)
    # ---- the earlier version's store, written by hand through the framework-neutral API
    with strata.Store.open(path, host_budget="64MiB", staging="64MiB", chunk_size="4MiB",
                           create=True) as s:
        o = strata.OffloadedOptimizer.create(s, "adamw", _checkpointed_hp(1e-2),
                                             key_prefix="optim/",
                                             default_placement=tier, arithmetic="torch")
        held = {i: o.add_param(f"p{i}", init[i].numel(),
                               init[i].reshape(-1).contiguous().numpy(), placement=tier)
                for i in (0, 2)}
        for _ in range(3):
            for p in twin:
                p.grad = torch.randn(p.shape, generator=g)
            for i, h in held.items():
                o.set_grad(h, twin[i].grad.reshape(-1).contiguous())
            o.step()
            ref.step()
        s.put("optim/torch/empty_steps", np.array([[1, 3], [3, 3]], dtype=np.int64),
              overwrite=True)
        o.checkpoint()
        o.close()

    def resume_and_step(steps, expect_steps):
        """OffloadAdamW resumed from the store: as torch before and after ``steps`` steps."""
        ours = [torch.nn.Parameter(torch.full_like(t, 7.0)) for t in init]  # overwritten
        opt = st.OffloadAdamW(ours, lr=1e-2, path=path, tier=tier, arithmetic="torch",
                              resume=True)
        assert "optim/torch/empty_steps" not in opt.store  # read once, then deleted
        _assert_bit_identical(ours, twin)
        _assert_steps_and_moments_match(opt.state_dict(), ref.state_dict(), 4)
        assert [opt.state_dict()["state"][i]["step"].item() for i in (1, 3)] == expect_steps
        _step_both(g, ours, twin, opt, ref, steps)
        _assert_bit_identical(ours, twin)
        _assert_steps_and_moments_match(opt.state_dict(), ref.state_dict(), 4)
        return opt

    opt = resume_and_step(3, [3.0, 3.0])
    opt.checkpoint()
    opt.close()
    # A leftover object (say, a crash between the migration's commit and the delete) is
    # ignored: the optimizer's checkpoint holds the counts.
    with strata.Store.open(path, host_budget="16MiB", staging="4MiB", workers=1) as s:
        s.put("optim/torch/empty_steps", np.array([[1, 99], [3, 99]], dtype=np.int64),
              overwrite=True)
    resume_and_step(2, [6.0, 6.0]).close()


def test_resume_of_a_checkpoint_without_zero_size_step_counts(tmp_path):
    """Earlier still, zero-size parameters' counts were not saved at all: such a checkpoint
    resumes with them at step 0 (and the others as checkpointed)."""
    path = str(tmp_path / "s")
    with strata.Store.open(path, host_budget="64MiB", staging="64MiB", chunk_size="4MiB",
                           create=True) as s:
        o = strata.OffloadedOptimizer.create(s, "adam", _checkpointed_hp(0.0))
        h = o.add_param("p1", 3, np.ones(3, dtype=np.float32))
        o.set_grad(h, np.ones(3, dtype=np.float32))
        o.step()
        o.checkpoint()
        o.close()
    params = [torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.zeros(3))]
    opt = st.OffloadAdam(params, lr=1e-2, path=path, resume=True)
    assert sorted(opt.state_dict()["state"]) == [1]  # p0 restarts: no state yet
    assert opt.state_dict()["state"][1]["step"].item() == 1.0
    for p in params:
        p.grad = torch.ones(p.shape)
    opt.step()
    sd = opt.state_dict()
    assert [sd["state"][i]["step"].item() for i in (0, 1)] == [1.0, 2.0]
    opt.close()


def test_resume_refuses_a_zero_size_parameter_that_now_has_elements(tmp_path):
    path = str(tmp_path / "s")
    a = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(0))]
    opt = st.OffloadAdam(a, lr=1e-2, path=path)
    for p in a:
        p.grad = torch.ones(p.shape)
    opt.step()
    opt.checkpoint()
    opt.close()
    b = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(b, lr=1e-2, path=path, resume=True)
    assert str(e.value) == "checkpointed parameter p1 has 0 elements, the model's has 2"


# ---- 7. add_param numel whose byte size overflows ----------------------------------------

def test_add_param_numel_overflow_is_refused(store):
    o = strata.OffloadedOptimizer.create(store, "adamw", {"lr": 0.1})
    limit = (2**63 - 1) // 4
    keys_before = store.keys()
    for numel in (2**62, limit + 1, 2**64 - 1):
        with pytest.raises(strata.InvalidArgumentError) as e:
            o.add_param("h", numel)
        assert isinstance(e.value, ValueError)
        assert e.value.message.startswith(f"parameter 'h' has numel {numel}: ")
        assert f"(numel <= {limit})" in e.value.message
    assert o.num_params() == 0
    assert store.keys() == keys_before  # nothing committed
    assert o.add_param("h", 4, np.arange(4, dtype=np.float32)) == 0
    assert o.read_param(0).tolist() == [0.0, 1.0, 2.0, 3.0]
    o.close()
