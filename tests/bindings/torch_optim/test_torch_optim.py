"""strata.torch.OffloadAdam / OffloadAdamW against torch.optim.Adam / AdamW."""
import os

import numpy as np
import pytest
import torch

import strata
import strata.torch as st


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    return m.to(dtype)


def _train(model, opt, steps, seed=1, clip=None):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g).to(next(model.parameters()).dtype)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def _max_diff(m1, m2):
    return max((a.float() - b.float()).abs().max().item()
               for a, b in zip(m1.parameters(), m2.parameters()))


CASES = [
    (st.OffloadAdam, torch.optim.Adam, dict(lr=1e-2)),
    (st.OffloadAdam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.05, amsgrad=True)),
    (st.OffloadAdamW, torch.optim.AdamW, dict(lr=1e-2)),
    (st.OffloadAdamW, torch.optim.AdamW, dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6,
                                              weight_decay=0.2, maximize=True)),
]


@pytest.mark.parametrize("ours,theirs,kw", CASES,
                         ids=["adam", "adam-wd-amsgrad", "adamw", "adamw-custom"])
@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_parity_with_torch(tmp_path, ours, theirs, kw, tier):
    m1, m2 = _model(), _model()
    o1 = ours(m1.parameters(), path=str(tmp_path / "s"), tier=tier, num_threads=1,
              sub_group_numel=1000, **kw)
    o2 = theirs(m2.parameters(), **kw)
    l1 = _train(m1, o1, 15)
    l2 = _train(m2, o2, 15)
    assert _max_diff(m1, m2) <= 2e-6
    assert abs(l1[-1] - l2[-1]) <= 1e-5 * max(1.0, abs(l2[-1]))
    if tier == "nvme":
        numel = sum(p.numel() for p in m1.parameters())
        n_states = 3 if kw.get("amsgrad") else 2
        assert o1.last_step["bytes_read"] == numel * 4 * (1 + n_states)
        assert o1.last_step["bytes_written"] == numel * 4 * (1 + n_states)
    o1.close()


@pytest.mark.parametrize("ours,theirs,kw", CASES,
                         ids=["adam", "adam-wd-amsgrad", "adamw", "adamw-custom"])
def test_torch_arithmetic_is_bit_exact(tmp_path, ours, theirs, kw):
    """arithmetic="torch": the offloaded step (NVMe pipeline, odd sub-groups) rounds exactly
    like torch.optim, so whole training runs are bit-identical."""
    m1, m2 = _model(), _model()
    o1 = ours(m1.parameters(), path=str(tmp_path / "s"), tier="nvme", num_threads=1,
              sub_group_numel=1000, arithmetic="torch", **kw)
    o2 = theirs(m2.parameters(), **kw)
    l1 = _train(m1, o1, 15)
    l2 = _train(m2, o2, 15)
    assert _max_diff(m1, m2) == 0.0
    assert l1 == l2
    sd1, sd2 = o1.state_dict(), o2.state_dict()
    for i, s2 in sd2["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sd1["state"][i][k], s2[k])
    o1.close()


def test_param_groups_and_lr_changes(tmp_path):
    m1, m2 = _model(), _model()

    def groups(m):
        return [{"params": m[0].parameters(), "lr": 1e-2},
                {"params": m[2].parameters(), "lr": 3e-3, "weight_decay": 0.0}]

    o1 = st.OffloadAdamW(groups(m1), path=str(tmp_path / "s"), weight_decay=0.1, num_threads=1)
    o2 = torch.optim.AdamW(groups(m2), weight_decay=0.1)
    s1 = torch.optim.lr_scheduler.StepLR(o1, step_size=1, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(o2, step_size=1, gamma=0.5)
    for _ in range(3):
        _train(m1, o1, 3)
        _train(m2, o2, 3)
        s1.step()
        s2.step()
    assert o1.param_groups[0]["lr"] == pytest.approx(1e-2 / 8)
    assert _max_diff(m1, m2) <= 2e-6
    o1.close()


def test_gradient_clipping_matches_clip_grad_norm(tmp_path):
    m1, m2 = _model(), _model()
    o1 = st.OffloadAdamW(m1.parameters(), lr=1e-2, path=str(tmp_path / "s"),
                         max_grad_norm=0.05, num_threads=1)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    _train(m1, o1, 8)
    _train(m2, o2, 8, clip=0.05)
    assert o1.last_step["clip_coef"] < 1.0
    assert _max_diff(m1, m2) <= 2e-6
    o1.close()


def test_state_dict_round_trips_with_torch(tmp_path):
    m1, m2 = _model(), _model()
    o1 = st.OffloadAdamW(m1.parameters(), lr=1e-2, path=str(tmp_path / "s"), num_threads=1)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    _train(m1, o1, 5)
    _train(m2, o2, 5)
    sd1, sd2 = o1.state_dict(), o2.state_dict()
    assert sd1["param_groups"][0]["params"] == sd2["param_groups"][0]["params"]
    for i, s2 in sd2["state"].items():
        s1 = sd1["state"][i]
        assert float(s1["step"]) == float(s2["step"]) == 5.0
        for k in ("exp_avg", "exp_avg_sq"):
            assert s1[k].shape == s2[k].shape
            assert (s1[k] - s2[k]).abs().max().item() <= 1e-6
    # ours -> a fresh torch optimizer, torch's -> a fresh strata optimizer: same trajectory
    m3, m4 = _model(), _model()
    m3.load_state_dict(m1.state_dict())
    m4.load_state_dict(m2.state_dict())
    o3 = torch.optim.AdamW(m3.parameters(), lr=1e-2)
    o3.load_state_dict(sd1)
    o4 = st.OffloadAdamW(m4.parameters(), lr=1e-2, path=str(tmp_path / "s4"), num_threads=1)
    o4.load_state_dict(sd2)
    _train(m3, o3, 4, seed=7)
    _train(m4, o4, 4, seed=7)
    _train(m2, o2, 4, seed=7)
    assert _max_diff(m3, m2) <= 2e-6
    assert _max_diff(m4, m2) <= 2e-6
    o1.close()
    o4.close()


def test_bf16_model_keeps_fp32_masters(tmp_path):
    m_half = _model(dtype=torch.bfloat16)
    m_ref = _model()  # fp32 model + AdamW: what the fp32 masters must track
    o1 = st.OffloadAdamW(m_half.parameters(), lr=1e-2, path=str(tmp_path / "s"),
                         num_threads=1)
    assert all(p.dtype == torch.bfloat16 for p in m_half.parameters())
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    y = torch.randint(0, 5, (64,), generator=g)
    l = []
    for _ in range(10):  # one fixed batch: the loss must fall
        o1.zero_grad()
        loss = torch.nn.functional.cross_entropy(m_half(x).float(), y)
        loss.backward()
        o1.step()
        l.append(loss.item())
    assert all(p.dtype == torch.bfloat16 for p in m_half.parameters())
    sd = o1.state_dict()
    for i, p in enumerate(m_half.parameters()):
        master = sd["state"][i]["master_param"]
        assert master.dtype == torch.float32
        # the model's weights are the masters rounded to bf16 (round to nearest even)
        assert torch.equal(master.to(torch.bfloat16), p.detach())
    assert l[-1] < l[0]
    o1.close()


def test_checkpoint_and_resume(tmp_path):
    path = str(tmp_path / "ckpt")
    m1 = _model()
    o1 = st.OffloadAdamW(m1.parameters(), lr=1e-2, path=path, num_threads=1)
    _train(m1, o1, 4)
    o1.checkpoint()
    snapshot = [p.detach().clone() for p in m1.parameters()]
    o1.close()

    ref = _model()  # the uninterrupted run: 4 steps, then 3 more
    o_ref = st.OffloadAdamW(ref.parameters(), lr=1e-2, path=str(tmp_path / "ref"),
                            num_threads=1)
    _train(ref, o_ref, 4)
    _train(ref, o_ref, 3, seed=9)

    m2 = _model(seed=123)  # different init: resume overwrites it with the masters
    o2 = st.OffloadAdamW(m2.parameters(), lr=1e-2, path=path, resume=True, num_threads=1)
    for a, b in zip(m2.parameters(), snapshot):
        assert torch.equal(a.detach(), b)
    assert o2.state_dict()["state"][0]["step"].item() == 4.0
    _train(m2, o2, 3, seed=9)
    assert _max_diff(ref, m2) == 0.0
    o2.close()
    o_ref.close()


_CRASH_SCRIPT = """
import os, signal, sys, torch
import strata.torch as st
sys.path.insert(0, {here!r})
from test_torch_optim import _model, _train
m = _model()
o = st.OffloadAdamW(m.parameters(), lr=1e-2, path={path!r}, num_threads=1)
_train(m, o, 4)
o.checkpoint()
torch.save([p.detach().clone() for p in m.parameters()], {snap!r})
_train(m, o, 2, seed=5)   # not checkpointed
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_resume_after_sigkill_restores_last_checkpoint(tmp_path):
    import os
    import subprocess
    import sys
    path, snap = str(tmp_path / "crash"), str(tmp_path / "snap.pt")
    script = _CRASH_SCRIPT.format(here=os.path.dirname(__file__), path=path, snap=snap)
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), timeout=300)
    assert r.returncode == -9
    m = _model(seed=5)
    o = st.OffloadAdamW(m.parameters(), lr=1e-2, path=path, resume=True, num_threads=1)
    for a, b in zip(m.parameters(), torch.load(snap)):
        assert torch.equal(a.detach(), b)
    assert o.state_dict()["state"][0]["step"].item() == 4.0
    o.close()


def test_parameters_without_grad_are_not_stepped(tmp_path):
    m = _model()
    for p in m[2].parameters():
        p.requires_grad_(False)
    before = [p.detach().clone() for p in m[2].parameters()]
    o = st.OffloadAdam(m.parameters(), lr=1e-2, path=str(tmp_path / "s"), num_threads=1)
    _train(m, o, 2)
    for a, b in zip(m[2].parameters(), before):
        assert torch.equal(a, b)
    assert 2 not in o.state_dict()["state"] and 0 in o.state_dict()["state"]
    o.close()


def test_invalid_hyperparameters_raise_value_error(tmp_path):
    with pytest.raises(ValueError) as e:
        st.OffloadAdamW(_model().parameters(), lr=-1.0, path=str(tmp_path / "a"))
    assert str(e.value) == "Invalid learning rate: -1.0"
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_model().parameters(), betas=(1.0, 0.9), path=str(tmp_path / "b"))
    assert str(e.value) == "Invalid beta parameter at index 0: 1.0"
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_model().parameters(), tier="tape", path=str(tmp_path / "c"))
    assert str(e.value) == "tier must be 'nvme', 'host' or 'auto', got 'tape'"


@pytest.mark.parametrize("ours,theirs", [(st.OffloadAdam, torch.optim.Adam),
                                         (st.OffloadAdamW, torch.optim.AdamW)])
@pytest.mark.parametrize("bad", [dict(lr=-1), dict(lr=float("nan")), dict(eps=-1e-8),
                                 dict(betas=(0.9, 1.0)), dict(betas=(-0.1, 0.9)),
                                 dict(weight_decay=-0.5), dict(lr=-1.0, eps=-1.0)],
                         ids=lambda b: ",".join(f"{k}={v}" for k, v in b.items()))
def test_hyperparameter_errors_are_torchs(strata_dir, ours, theirs, bad):
    """strata's rule makes the checks (strata._strata.hyperparams_refusal); the messages are
    torch.optim's, value as given included, first failing check first."""
    with pytest.raises(ValueError) as want:
        theirs(_model().parameters(), **bad)
    with pytest.raises(ValueError) as got:
        ours(_model().parameters(), **bad)
    assert str(got.value) == str(want.value)
    assert os.listdir(strata_dir) == []


def test_hyperparams_refusal_names_the_refused_key():
    from strata import _strata as core
    assert core.hyperparams_refusal("adam", {"lr": 0.1, "beta2": 0.5}) is None
    key, message = core.hyperparams_refusal("adamw", {"lr": 0.1, "beta2": 1.5})
    assert key == "beta2"
    assert message == "AdamW: invalid beta parameter at index 1 1.5 (must be in [0, 1))"
    key, message = core.hyperparams_refusal("adam", {"nope": 1.0})
    assert key == "nope" and "nope" in message
    with pytest.raises(strata.InvalidArgumentError):
        core.hyperparams_refusal("adam", {"lr": "x"})
    with pytest.raises(strata.InvalidArgumentError):
        core.hyperparams_refusal("no-such-rule", {})


def test_betas_must_be_a_pair_checked_after_lr_and_eps(strata_dir):
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_model().parameters(), betas=(0.9, 0.99, 0.5), weight_decay=-1.0)
    assert str(e.value) == "betas must be a pair, got (0.9, 0.99, 0.5)"
    with pytest.raises(ValueError) as e:
        st.OffloadAdam(_model().parameters(), betas=(0.9,), eps=-2)
    assert str(e.value) == "Invalid epsilon value: -2"


def test_low_level_offloaded_optimizer(store):
    opt = strata.OffloadedOptimizer.create(store, "sgd", {"lr": 0.5}, num_threads=1)
    h = opt.add_param("w", 4, np.array([1, 2, 3, 4], dtype=np.float32), placement="nvme")
    opt.set_grad(h, np.array([1, 1, 1, 1], dtype=np.float32))
    stats = opt.step()
    assert stats["numel_updated"] == 4 and not stats["skipped"]
    np.testing.assert_array_equal(opt.read_param(h), np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    assert opt.step_count(h) == 1
    opt.set_grad(h, np.array([np.inf, 0, 0, 0], dtype=np.float32))
    assert opt.step()["skipped"]
    assert opt.step_count(h) == 1
    with pytest.raises(ValueError):
        opt.set_grad(h, np.zeros(5, dtype=np.float32))
    with pytest.raises(KeyError):
        opt.find_param("nope")
