"""OffloadOptimizer's ``config=`` (a strata configuration file, docs/configuration.md; as
OffloadAdam(W)'s, optim/_settings.py ``resolve_any``): the "optimizer" section's
default_placement, sub_group_numel, num_buffers, num_threads and state_dtype are the
defaults of its arguments, an argument given wins, the store it opens takes the "store"
section, ``optimizer.settings`` shows what is in effect, and a bad file fails with
OffloadAdamW's very error (type and message) before anything is created.
"""
import json

import pytest
import torch

import strata
import strata.torch as st
from strata.torch.optim import OffloadOptimizer

N = 1000  # elements of the parameter


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


@pytest.fixture(autouse=True)
def no_env_config(monkeypatch):
    monkeypatch.delenv("STRATA_CONFIG", raising=False)


def _param():
    torch.manual_seed(0)
    return torch.nn.Parameter(torch.randn(N))


def _two_steps(opt, p):
    """Two steps on fixed gradients; the parameter's value after them."""
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        p.grad = torch.randn(N, generator=g)
        opt.step()
    return p.detach().clone()


def _run(tmp_path, name, **kw):
    """AdamW through OffloadOptimizer with ``kw``: (settings, last_step, exp_avg's stat,
    parameter after two steps, store chunk bytes)."""
    p = _param()
    opt = OffloadOptimizer(torch.optim.AdamW, [p], lr=0.01, path=str(tmp_path / name), **kw)
    try:
        value = _two_steps(opt, p)
        info = opt.store.stat("optim/p/p0/exp_avg")
        return dict(opt.settings), dict(opt.last_step), info, value, opt.store.chunk_bytes
    finally:
        opt.close()


HOST_FILE = {"store": {"chunk_bytes": "256KiB"},
             "optimizer": {"default_placement": "host", "num_buffers": 2, "num_threads": 1,
                           "state_dtype": "bf16", "arithmetic": "torch"}}


def test_the_files_settings_are_used(tmp_path):
    f = write(tmp_path / "c.json", HOST_FILE)
    settings, last, info, value, chunk = _run(tmp_path, "file", config=f)
    assert settings == dict(tier="host", sub_group_numel=0, num_buffers=2, num_threads=1,
                            state_dtype="bf16", config=f)
    assert chunk == 256 << 10  # the store it opened took the "store" section
    assert (last["bytes_read"], last["bytes_written"]) == (0, 0)  # host tier: no I/O
    assert (info.dtype, info.nbytes) == ("bf16", 2 * N)  # bf16 states
    # the same as the arguments given explicitly, bit for bit
    _, _, _, want, _ = _run(tmp_path, "args", tier="host", num_buffers=2, num_threads=1,
                            state_dtype=torch.bfloat16)
    assert torch.equal(value, want)


def test_the_files_sub_group_numel_splits_the_step(tmp_path):
    f = write(tmp_path / "c.json", {"optimizer": {"sub_group_numel": 256}})
    settings, last, _, value, _ = _run(tmp_path, "file", config=f)
    assert settings["sub_group_numel"] == 256 and settings["tier"] == "nvme"
    assert last["sub_groups"] == 4  # 1000 elements in sub-groups of 256
    settings, last, _, want, _ = _run(tmp_path, "none")
    assert settings == dict(tier="nvme", sub_group_numel=0, num_buffers=4, num_threads=0,
                            state_dtype="fp32", config=None)
    assert last["sub_groups"] == 1 and last["bytes_read"] > 0
    assert torch.equal(value, want)  # sub-groups change no value


def test_explicit_arguments_win_over_the_file(tmp_path):
    f = write(tmp_path / "c.json", HOST_FILE)
    settings, last, info, _, _ = _run(tmp_path, "o", config=f, tier="nvme", num_buffers=3,
                                      sub_group_numel=512, state_dtype=torch.float32)
    assert settings == dict(tier="nvme", sub_group_numel=512, num_buffers=3, num_threads=1,
                            state_dtype="fp32", config=f)
    assert last["bytes_read"] > 0 and last["sub_groups"] == 2
    assert (info.dtype, info.nbytes) == ("fp32", 4 * N)


def test_the_stores_file_and_the_environments(tmp_path, monkeypatch):
    f = write(tmp_path / "c.json", HOST_FILE)
    with strata.Store.open(str(tmp_path / "s"), config=f) as store:
        p = _param()
        opt = OffloadOptimizer(torch.optim.SGD, [p], lr=0.1, store=store)
        try:
            assert opt.settings["config"] == f and opt.settings["tier"] == "host"
        finally:
            opt.close()
    monkeypatch.setenv("STRATA_CONFIG", f)
    settings, _, _, _, _ = _run(tmp_path, "env")  # $STRATA_CONFIG (config: None, as
    assert settings == dict(tier="host", sub_group_numel=0, num_buffers=2,  # OffloadAdam's)
                            num_threads=1, state_dtype="bf16", config=None)


BAD_FILES = [
    {"optimizer": {"num_bufers": 2}},  # an unknown key
    {"optimizer": {"num_buffers": 17}},  # out of range (0..16)
    {"optimizer": {"state_dtype": "fp16"}},
    {"optimizer": {"default_placement": "tape"}},
    {"strata_config": 2},
]


@pytest.mark.parametrize("i", range(len(BAD_FILES)))
def test_a_bad_file_fails_as_for_offload_adamw(tmp_path, i):
    f = write(tmp_path / "bad.json", BAD_FILES[i])
    with pytest.raises(strata.InvalidArgumentError) as want:
        st.OffloadAdamW([_param()], path=str(tmp_path / "adamw"), config=f)
    with pytest.raises(strata.InvalidArgumentError) as got:
        OffloadOptimizer(torch.optim.AdamW, [_param()], path=str(tmp_path / "any"), config=f)
    assert str(got.value) == str(want.value)
    assert f"config file '{f}'" in str(got.value)
    assert not (tmp_path / "any").exists()  # nothing created
    with pytest.raises(strata.NotFoundError, match="none.json"):
        OffloadOptimizer(torch.optim.SGD, [_param()], lr=0.1, path=str(tmp_path / "any"),
                         config=str(tmp_path / "none.json"))


def test_bad_arguments_fail_as_for_offload_adamw(tmp_path):
    for kw, msg in ((dict(tier="tape"), "tier must be 'nvme', 'host' or 'auto', got 'tape'"),
                    (dict(num_buffers=-1), "num_buffers must be an int >= 0, got -1"),
                    (dict(sub_group_numel=1.5),
                     "sub_group_numel must be an int >= 0, got float 1.5")):
        with pytest.raises(ValueError) as want:
            st.OffloadAdamW([_param()], path=str(tmp_path / "adamw"), **kw)
        with pytest.raises(ValueError) as got:
            OffloadOptimizer(torch.optim.AdamW, [_param()], path=str(tmp_path / "any"), **kw)
        assert str(got.value) == str(want.value) == msg
        assert not (tmp_path / "any").exists()


def test_the_files_bf16_states_for_a_refused_class(tmp_path):
    f = write(tmp_path / "c.json", {"optimizer": {"state_dtype": "bf16"}})
    with pytest.raises(ValueError, match="state_dtype=torch.bfloat16 is refused for "
                                         "torch.optim.Adagrad"):
        OffloadOptimizer(torch.optim.Adagrad, [_param()], path=str(tmp_path / "a"), config=f)
    settings, _, _, _, _ = _run(tmp_path, "ok", config=f, state_dtype="fp32")  # the argument
    assert settings["state_dtype"] == "fp32"


def test_a_pathlib_path_is_a_config_file_as_a_string_is(tmp_path):
    import pathlib
    f = write(tmp_path / "c.json", HOST_FILE)
    by_str = _run(tmp_path, "s", config=f)
    by_path = _run(tmp_path, "p", config=pathlib.Path(f))
    assert by_path[0]["config"] == f and by_path[0]["tier"] == "host"
    assert torch.equal(by_path[3], by_str[3])
    p = _param()
    adamw = st.OffloadAdamW([p], lr=0.01, path=str(tmp_path / "a"), config=pathlib.Path(f))
    assert adamw.settings["tier"] == "host"
    adamw.close()


@pytest.mark.parametrize("cls", [torch.optim.SGD, torch.optim.AdamW])
def test_overwrite_replaces_an_offload_optimizer_checkpoint(tmp_path, cls):
    """overwrite=True over a checkpoint of the same class (a rerun of a script): the old
    record and state objects are deleted, the new optimizer starts fresh (step 1 again,
    bit-identical to a first run)."""
    path = str(tmp_path / "o")
    kw = dict(lr=0.1, momentum=0.9) if cls is torch.optim.SGD else dict(lr=0.1)
    first = _param()
    opt = OffloadOptimizer(cls, [first], path=path, **kw)
    _two_steps(opt, first)
    opt.close()
    p = _param()
    opt = OffloadOptimizer(cls, [p], path=path, overwrite=True, **kw)
    got = _two_steps(opt, p)
    opt.close()
    q = _param()
    want = _two_steps(cls([q], **kw), q)
    assert torch.equal(got, want)
