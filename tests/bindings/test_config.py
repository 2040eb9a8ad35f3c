"""The configuration file in Python: Store.open(config=), $STRATA_CONFIG, strata.load_config,
the strata.torch optimizers' config= (and the store's file), precedence and errors."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import strata
import strata.torch as st


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


@pytest.fixture(autouse=True)
def no_env_config(monkeypatch):
    monkeypatch.delenv("STRATA_CONFIG", raising=False)


def test_store_open_takes_the_file_below_env_and_arguments(tmp_path, monkeypatch):
    f = write(tmp_path / "c.json", {"store": {"chunk_bytes": "128KiB", "worker_threads": 2}})
    with strata.Store.open(str(tmp_path / "a"), config=f) as s:
        assert s.chunk_bytes == 128 << 10
        assert s.config_file == f
        s.put("x", np.arange(70000, dtype=np.float32))
        assert s.stat("x").num_chunks == 3  # 280000 bytes in 128 KiB chunks
    with strata.Store.open(str(tmp_path / "b"), config=f, chunk_size="64KiB") as s:
        assert s.chunk_bytes == 64 << 10  # the argument wins
    monkeypatch.setenv("STRATA_CONFIG", f)
    with strata.Store.open(str(tmp_path / "c")) as s:  # $STRATA_CONFIG
        assert s.chunk_bytes == 128 << 10 and s.config_file == f
    monkeypatch.setenv("STRATA_CHUNK_SIZE", "256KiB")
    with strata.Store.open(str(tmp_path / "d")) as s:  # the environment over the file
        assert s.chunk_bytes == 256 << 10
    monkeypatch.delenv("STRATA_CHUNK_SIZE")
    monkeypatch.delenv("STRATA_CONFIG")
    with strata.Store.open(str(tmp_path / "e")) as s:
        assert s.chunk_bytes == 64 << 20 and s.config_file == ""


def test_bad_files_raise_naming_key_value_and_file(tmp_path):
    f = write(tmp_path / "u.json", {"store": {"chunk_byte": 4096}})
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.Store.open(str(tmp_path / "s"), config=f)
    assert (f"config file '{f}': unknown key 'store.chunk_byte' (did you mean "
            "'store.chunk_bytes'?)") in str(e.value)
    assert not (tmp_path / "s").exists()  # nothing created
    g = write(tmp_path / "v.json", {"store": {"durability": "sync"}})
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"store.durability: expected one of \"put\", \"flush\", got \"sync\""):
        strata.Store.open(str(tmp_path / "s"), config=g)
    with pytest.raises(strata.NotFoundError, match="none.json"):
        strata.Store.open(str(tmp_path / "s"), config=str(tmp_path / "none.json"))
    with pytest.raises(strata.InvalidArgumentError, match="optimizer.num_buffers"):
        strata.load_config(write(tmp_path / "o.json", {"optimizer": {"num_buffers": 17}}))
    # 0 is auto (as many slots as the pinned budget holds), as for OffloadOptions
    assert strata.load_config(write(tmp_path / "z.json", {"optimizer": {"num_buffers": 0}}))[
        "optimizer"]["num_buffers"] == 0


def test_load_config_round_trips(tmp_path):
    f = write(tmp_path / "c.json", {"io": {"block_size": "1MiB"},
                                    "optimizer": {"num_threads": 2},
                                    "measured": {"adam_params_per_s": 1e8}})
    c = strata.load_config(f)
    assert c == {"strata_config": 1, "io": {"block_size": 1 << 20},
                 "optimizer": {"num_threads": 2}, "measured": {"adam_params_per_s": 1e8}}
    assert strata.load_config(write(tmp_path / "d.json", c)) == c
    assert strata.load_config() == {}


def test_a_tuned_file_opens_a_store(tmp_path):
    cli = os.environ.get("STRATA_CLI")
    if not cli:
        pytest.skip("STRATA_CLI (the strata tool) is not set")
    d = tmp_path / "drive"
    d.mkdir()
    out = str(tmp_path / "strata.json")
    subprocess.run([cli, "tune", "--path", str(d), "--path", str(tmp_path), "--quick",
                    "--output", out, "--json"], check=True, capture_output=True)
    cfg = json.load(open(out))
    with strata.Store.open(str(tmp_path / "root"), config=out) as s:
        assert s.chunk_bytes == cfg["store"]["chunk_bytes"]
        s.put("x", np.ones(1000, dtype=np.float32))
        np.testing.assert_array_equal(s.get("x"), np.ones(1000, dtype=np.float32))
    assert (d / "catalog.db").exists() is False  # data files only, in the tuned directories
    assert strata.load_config(out) == cfg


def test_torch_optimizer_settings_from_the_file(tmp_path):
    f = write(tmp_path / "c.json", {
        "store": {"chunk_bytes": "256KiB"},
        "optimizer": {"num_buffers": 2, "num_threads": 1, "sub_group_numel": 4096,
                      "default_placement": "host", "arithmetic": "torch"}})
    p = torch.nn.Parameter(torch.ones(10000))
    opt = st.OffloadAdam([p], path=str(tmp_path / "o1"), config=f)
    try:
        s = opt.settings
        assert (s["num_buffers"], s["num_threads"], s["sub_group_numel"], s["tier"],
                s["arithmetic"]) == (2, 1, 4096, "host", "torch")
        assert opt.store.chunk_bytes == 256 << 10 and opt.store.config_file == f
        p.grad = torch.full_like(p, 0.5)
        opt.step()
        ref = torch.nn.Parameter(torch.ones(10000))
        ref.grad = torch.full_like(ref, 0.5)
        torch.optim.Adam([ref]).step()
        assert torch.equal(p.detach(), ref.detach())  # arithmetic "torch": bit-identical
    finally:
        opt.close()
    # explicit arguments win; a store opened with the file passes it on
    with strata.Store.open(str(tmp_path / "s"), config=f) as store:
        q = torch.nn.Parameter(torch.ones(100))
        opt = st.OffloadAdam([q], store=store, num_buffers=3, tier="nvme")
        try:
            s = opt.settings
            assert (s["num_buffers"], s["num_threads"], s["tier"], s["config"]) == (3, 1, "nvme", f)
        finally:
            opt.close()
    opt = st.OffloadAdam([torch.nn.Parameter(torch.ones(10))], path=str(tmp_path / "o2"))
    try:  # no file: the built-in defaults
        s = opt.settings
        assert (s["num_buffers"], s["num_threads"], s["tier"], s["arithmetic"]) == (4, 0, "nvme", "simd")
        assert s["state_dtype"] == "fp32"
    finally:
        opt.close()


def test_the_files_state_dtype_gives_bf16_moments_unless_an_argument_says_otherwise(tmp_path):
    f = write(tmp_path / "c.json", {"optimizer": {"state_dtype": "bf16"}})
    for i, (arg, want, nbytes) in enumerate([(None, "bf16", 2 * 1000),
                                             (torch.float32, "fp32", 4 * 1000)]):
        p = torch.nn.Parameter(torch.ones(1000))
        opt = st.OffloadAdamW([p], path=str(tmp_path / f"o{i}"), config=f, state_dtype=arg)
        try:
            assert opt.settings["state_dtype"] == want
            p.grad = torch.full_like(p, 0.5)
            opt.step()
            info = opt.store.stat("optim/p/p0/exp_avg")
            assert (info.dtype, info.nbytes) == (want, nbytes)
        finally:
            opt.close()
    bad = write(tmp_path / "bad.json", {"optimizer": {"state_dtype": "fp16"}})
    with pytest.raises(strata.InvalidArgumentError,
                       match="optimizer.state_dtype: expected one of \"fp32\", \"bf16\", "
                             "got \"fp16\""):
        st.OffloadAdamW([torch.nn.Parameter(torch.ones(10))], path=str(tmp_path / "o9"),
                        config=bad)
