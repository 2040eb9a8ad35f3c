"""strata.torch optimizers and their store: a reused path (AlreadyExists naming resume=True,
overwrite=True), parameter names in the store, the per-user default directory and the
temporary stores a killed process leaves behind.

Exact comparisons use arithmetic="torch" (torch.optim's rounding, bit-identical)."""
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import strata
import strata._data_dir as data_dir
import strata.torch as st

KW = dict(num_threads=1, arithmetic="torch")


def _model(seed=0, sizes=(3, 4, 2)):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    return torch.nn.Sequential(*layers)


def _train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        for i, p in enumerate(model.parameters()):
            p.grad = torch.linspace(-1.0, 1.0, p.numel()).view(p.shape) * (k + 1) * (i + 1)
        opt.step()


def _assert_same(m1, m2):
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.detach(), b.detach())


def _checkpointed(path, steps):
    """A model trained ``steps`` steps by an OffloadAdam checkpointed and closed at ``path``."""
    m = _model()
    o = st.OffloadAdam(m.parameters(), path=path, **KW)
    _train(m, o, steps)
    o.checkpoint()
    o.close()
    return m


def _keys(path):
    with strata.Store.open(path, create=False) as s:
        return sorted(s.keys())


# ---- a reused path ------------------------------------------------------------------------

def test_a_reused_path_is_refused_naming_resume_and_overwrite(tmp_path):
    path = str(tmp_path / "s")
    m = _checkpointed(path, 1)
    with pytest.raises(strata.AlreadyExistsError) as e:
        st.OffloadAdam(m.parameters(), path=path, **KW)
    assert e.value.message == (
        f"OffloadAdam: the store at {path!r} already holds an optimizer checkpoint under "
        "key_prefix 'optim/': pass resume=True to continue from it, overwrite=True to delete "
        "it and start fresh, or another key_prefix")
    assert e.value.message.count("::") == 0
    with pytest.raises(ValueError, match=r"resume=True continues from the checkpoint that "
                                         r"overwrite=True deletes: pass one of them"):
        st.OffloadAdam(m.parameters(), path=path, resume=True, overwrite=True, **KW)


def test_the_low_level_create_names_its_own_resume(store):
    o = strata.OffloadedOptimizer.create(store, "adam")
    o.checkpoint()
    o.close()
    with pytest.raises(strata.AlreadyExistsError) as e:
        strata.OffloadedOptimizer.create(store, "adam")
    assert "already holds an optimizer under 'optim/' (OffloadedOptimizer.resume reopens " \
        "it, OffloadedOptimizer.remove deletes it)" in e.value.message
    strata.OffloadedOptimizer.remove(store)
    assert "optim/meta" not in store
    with pytest.raises(strata.NotFoundError):
        strata.OffloadedOptimizer.remove(store)


def test_overwrite_starts_fresh_and_removes_only_the_old_optimizers_objects(tmp_path):
    path = str(tmp_path / "s")
    # the old optimizer (3 tensors of another model), a second one nested under its prefix,
    # and a user object under the prefix
    old = _model(seed=1, sizes=(5, 6, 7, 2))
    o = st.OffloadAdamW(old.parameters(), path=path, **KW)
    _train(old, o, 2)
    o.close()
    nested_model = _model(seed=2)  # (overlapping prefixes cannot be open together)
    nested = st.OffloadAdamW(nested_model.parameters(), path=path,
                             key_prefix="optim/nested/", **KW)
    _train(nested_model, nested, 3)
    nested.store.put("optim/user", torch.arange(4.0).numpy())
    nested.close()
    before = _keys(path)
    old_keys = {k for k in before if k.startswith("optim/") and
                not k.startswith("optim/nested/") and k != "optim/user"}
    assert len(old_keys) == 1 + 6 * 3  # the record, 6 tensors x (param, exp_avg, exp_avg_sq)

    m, ref = _model(), _model()
    o = st.OffloadAdamW(m.parameters(), path=path, overwrite=True, **KW)
    o_ref = torch.optim.AdamW(ref.parameters())
    _train(m, o, 3)
    _train(ref, o_ref, 3)
    _assert_same(m, ref)  # stepped from the model's values with fresh moments, as torch
    assert all(int(s["step"]) == 3 for s in o.state_dict()["state"].values())
    o.checkpoint()
    o.close()
    after = set(_keys(path))
    assert {k for k in before if k not in old_keys} <= after  # nested + user object stay
    new_keys = {k for k in after if k.startswith("optim/") and
                not k.startswith("optim/nested/") and k != "optim/user"}
    assert new_keys == {"optim/meta"} | {f"optim/p/p{i}/{s}" for i in range(4)
                                         for s in ("param", "exp_avg", "exp_avg_sq")}
    with strata.Store.open(path, create=False) as s:  # p0: the new model's, 4 x 3
        assert s.stat("optim/p/p0/exp_avg").shape == (12,)
    # the nested optimizer resumes untouched
    again = _model(seed=2)
    r = st.OffloadAdamW(again.parameters(), path=path, key_prefix="optim/nested/",
                        resume=True, **KW)
    _assert_same(again, nested_model)
    r.close()
    # overwrite=True without a checkpoint there just creates one
    o = st.OffloadAdamW(_model().parameters(), path=str(tmp_path / "new"), overwrite=True,
                        **KW)
    o.close()


# ---- parameter names -------------------------------------------------------------------------

def test_named_parameters_name_the_store_objects_and_step_as_torch(tmp_path):
    path = str(tmp_path / "s")
    m, ref = _model(), _model()
    o = st.OffloadAdamW(m.named_parameters(), lr=0.01, path=path, **KW)
    o_ref = torch.optim.AdamW(ref.parameters(), lr=0.01)
    _train(m, o, 3)
    _train(ref, o_ref, 3)
    _assert_same(m, ref)
    assert len(o.param_groups) == 1 and o.param_groups[0]["params"] == list(m.parameters())
    o.checkpoint()
    o.close()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    for i, n in enumerate(names):
        for stream in ("param", "exp_avg", "exp_avg_sq"):
            assert f"optim/p/p{i}:{n}/{stream}" in _keys(path)
    cli = os.environ.get("STRATA_CLI")
    if cli:  # what `strata store ls` shows
        out = subprocess.run([cli, "store", "ls", path], capture_output=True, text=True,
                             check=True).stdout
        assert "optim/p/p2:1.weight/exp_avg\n" in out, out
    # a resume with the names, with plain parameters, and with the names in another order
    m2 = _model(seed=5)
    o = st.OffloadAdamW(m2.named_parameters(), path=path, resume=True, **KW)
    _assert_same(m2, m)
    _train(m2, o, 1, start=3)
    _train(ref, o_ref, 1, start=3)
    _assert_same(m2, ref)
    o.close()
    o = st.OffloadAdamW(_model(seed=6).parameters(), path=path, resume=True, **KW)
    o.close()
    swapped = list(_model(seed=7).named_parameters())
    swapped[0], swapped[1] = (swapped[1][0], swapped[0][1]), (swapped[0][0], swapped[1][1])
    with pytest.raises(ValueError, match=r"the checkpoint under 'optim/' holds parameter 0 "
                                         r"as '0.weight', the model gives '0.bias': give the "
                                         r"parameters in the checkpoint's order"):
        st.OffloadAdamW(swapped, path=path, resume=True, **KW)


def test_named_param_groups_and_unnamed_checkpoints(tmp_path):
    path = str(tmp_path / "s")
    m, ref = _model(), _model()
    decay = [(n, p) for n, p in m.named_parameters() if n.endswith("weight")]
    no_decay = [(n, p) for n, p in m.named_parameters() if n.endswith("bias")]
    o = st.OffloadAdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                        path=path, **KW)
    o_ref = torch.optim.AdamW([{"params": [ref[0].weight, ref[1].weight]},
                               {"params": [ref[0].bias, ref[1].bias], "weight_decay": 0.0}])
    # a group added later, named too
    extra, extra_ref = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    o.add_param_group({"params": [("extra", extra)], "lr": 0.1})
    o_ref.add_param_group({"params": [extra_ref], "lr": 0.1})
    for k in range(2):
        _train(m, o, 1, start=k)
        _train(ref, o_ref, 1, start=k)
        extra.grad = torch.full((3,), 0.5 * (k + 1))
        extra_ref.grad = extra.grad.clone()
        o.step()
        o_ref.step()
    _assert_same(m, ref)
    assert torch.equal(extra.detach(), extra_ref.detach())
    o.checkpoint()
    o.close()
    assert "optim/p/p4:extra/param" in _keys(path)
    assert "optim/p/p1:1.weight/param" in _keys(path)
    with pytest.raises(ValueError, match=r"param group 0 mixes \(name, parameter\) pairs with "
                                         r"plain parameters; give all of its parameters one "
                                         r"way"):
        st.OffloadAdamW([("0.weight", m[0].weight), m[0].bias], path=str(tmp_path / "x"), **KW)
    assert not os.path.exists(tmp_path / "x")
    # an unnamed checkpoint resumes with named parameters (found by index, as before)
    path2 = str(tmp_path / "unnamed")
    m3 = _checkpointed(path2, 2)
    m4 = _model(seed=9)
    o = st.OffloadAdam(m4.named_parameters(), path=path2, resume=True, **KW)
    _assert_same(m4, m3)
    o.close()
    assert "optim/p/p0/param" in _keys(path2)


# ---- the default directory and temporary stores -----------------------------------------------

@pytest.fixture
def default_dir(tmp_path, monkeypatch):
    """strata's default directory, moved under tmp_path ($STRATA_DIR unset)."""
    monkeypatch.delenv("STRATA_DIR", raising=False)
    monkeypatch.setattr(data_dir, "DEFAULT_DIR_TEMPLATE", str(tmp_path / "strata-{uid}"))
    return str(tmp_path / f"strata-{os.getuid()}")


def test_the_default_directory_is_per_user_and_private(default_dir):
    o = st.OffloadAdam(_model().parameters(), **KW)
    assert os.path.dirname(o._owned_dir) == default_dir
    assert os.path.basename(o._owned_dir).startswith(f"optim-{os.getpid()}-")
    assert stat.S_IMODE(os.stat(default_dir).st_mode) == 0o700
    o.close()
    assert os.listdir(default_dir) == []
    os.chmod(default_dir, 0o777)  # this user's, too open: made private again
    assert strata.default_data_dir() == default_dir
    assert stat.S_IMODE(os.stat(default_dir).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_a_default_directory_of_another_user_is_refused(default_dir):
    os.mkdir(default_dir)
    os.chown(default_dir, 65534, 65534)
    with pytest.raises(PermissionError) as e:
        st.OffloadAdam(_model().parameters(), **KW)
    assert str(e.value).endswith(
        f"strata's default directory {default_dir} is a directory owned by uid 65534, not by "
        f"this user (uid 0); remove it or set STRATA_DIR to a directory of yours")


def test_a_default_directory_that_is_a_symlink_is_refused(default_dir, tmp_path):
    os.mkdir(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", default_dir)
    with pytest.raises(PermissionError, match="is not a directory owned by"):
        strata.default_data_dir()


CHILD = textwrap.dedent("""
    import sys, time, torch, strata.torch as st
    o = st.OffloadAdam([torch.nn.Parameter(torch.ones(10))], num_threads=1)
    print(o._owned_dir, flush=True)
    time.sleep(600)
""")


def _child(env):
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                         env=env)
    return p, p.stdout.readline().strip()


def test_a_sigkilled_processs_temporary_store_is_reclaimed(tmp_path, monkeypatch):
    base = tmp_path / "d"
    env = dict(os.environ, STRATA_DIR=str(base))
    monkeypatch.setenv("STRATA_DIR", str(base))
    killed, killed_dir = _child(env)
    alive, alive_dir = _child(env)
    try:
        assert os.path.isdir(killed_dir) and os.path.isdir(alive_dir)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert os.path.isdir(killed_dir)  # left behind
        # a dead pid whose store is open elsewhere (its lock held) stays too
        held = base / f"optim-{killed.pid}-held"
        held.mkdir()
        with strata.Store.open(str(held)):
            o = st.OffloadAdam([torch.nn.Parameter(torch.ones(4))], **KW)
            assert sorted(os.listdir(base)) == sorted(
                os.path.basename(d) for d in (alive_dir, held, o._owned_dir))
            o.close()
        # once its lock is free, it goes at the next temporary store
        o = st.OffloadAdam([torch.nn.Parameter(torch.ones(4))], **KW)
        assert sorted(os.listdir(base)) == sorted(
            os.path.basename(d) for d in (alive_dir, o._owned_dir))
        o.close()
    finally:
        alive.kill()
        alive.wait()
        killed.wait()
