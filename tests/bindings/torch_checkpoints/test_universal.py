"""save_universal_checkpoint / load_universal_checkpoint in one process: the zip files
torch.load and zipfile read (CRC-32 checked, zip64 records forced), the combined CRC, a
layout written by torch.save itself (as DeepSpeed's ds_to_universal.py writes it) loaded
and continued bit-identically to torch.optim.AdamW, amsgrad, pieces smaller than a
tensor, and the errors. The multi-rank resume is test_universal_ranks.py."""
import os
import zipfile
import zlib

import pytest
import torch

import strata.torch as st
import strata.torch.checkpoints._universal_zip as uz


def _net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _groups(m):
    return [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
            {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0, "lr": 3e-3}]


def _steps(pairs, start, n):
    for step in range(start, start + n):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 7, generator=g)
        for m, o in pairs:
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()


def _same(m, opt, ref, ref_opt):
    for (n, a), (_, b) in zip(ref.named_parameters(), m.named_parameters()):
        assert torch.equal(a, b), n
        for k, v in ref_opt.state[a].items():
            assert torch.equal(opt.state[b][k], v), (n, k)


def test_crc32_combine_matches_zlib():
    data = os.urandom(5000)
    for cut in (0, 1, 7, 4096, 4999, 5000):
        a, b = data[:cut], data[cut:]
        assert uz.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)


@pytest.mark.parametrize("zip64", [False, True])
def test_layout_reads_with_torch_and_zipfile(tmp_path, monkeypatch, zip64):
    if zip64:
        monkeypatch.setattr(uz, "ZIP64_LIMIT", 0)  # every size and offset as zip64 fields
    t = torch.randn(3, 11)
    lay = uz.TensorFileLayout(torch.float32, t.shape, {"cat_dim": 0})
    f = str(tmp_path / "fp32.pt")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    lay.write_skeleton(fd)
    raw = t.numpy().tobytes()
    cut = 52  # two writers' ranges
    uz.pwrite_all(fd, raw[:cut], lay.data_offset)
    uz.pwrite_all(fd, raw[cut:], lay.data_offset + cut)
    lay.patch_crc(fd, uz.crc32_combine(zlib.crc32(raw[:cut]), zlib.crc32(raw[cut:]),
                                       len(raw) - cut))
    os.close(fd)
    assert os.path.getsize(f) == lay.file_nbytes and lay.data_offset % 64 == 0
    assert zipfile.ZipFile(f).testzip() is None
    d = torch.load(f)
    assert set(d) == {"param", "cat_dim"} and d["cat_dim"] == 0 and torch.equal(d["param"], t)


def test_round_trip_and_continue_like_torch(tmp_path):
    m, ref = _net(0), _net(0)
    opt = st.OffloadAdamW(_groups(m), lr=1e-2, path=str(tmp_path / "a"), arithmetic="torch")
    ref_opt = torch.optim.AdamW(_groups(ref), lr=1e-2)
    _steps([(m, opt), (ref, ref_opt)], 0, 3)
    u = tmp_path / "u"
    st.save_universal_checkpoint(opt, m, u, piece_bytes=12)  # 3 elements a piece
    zero = u / "zero"
    assert sorted(os.listdir(zero)) == ["0.bias", "0.weight", "2.bias", "2.weight",
                                        "optimizer_state.pt"]
    assert sorted(os.listdir(zero / "0.weight")) == ["exp_avg.pt", "exp_avg_sq.pt",
                                                     "fp32.pt", "step.pt"]
    for n, p in ref.named_parameters():
        assert torch.equal(torch.load(zero / n / "fp32.pt")["param"], p.detach())
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.load(zero / n / f"{k}.pt")["param"], ref_opt.state[p][k])
        assert torch.equal(torch.load(zero / n / "step.pt"), ref_opt.state[p]["step"])
    meta = torch.load(zero / "optimizer_state.pt")
    assert meta["param_names"] == [["0.weight", "2.weight"], ["0.bias", "2.bias"]]
    assert [g["params"] for g in meta["param_groups"]] == [[0, 1], [0, 1]]
    assert [g["lr"] for g in meta["param_groups"]] == [1e-2, 3e-3]
    m2 = _net(1)
    opt2 = st.OffloadAdamW(_groups(m2), lr=0.5, path=str(tmp_path / "b"), arithmetic="torch")
    st.load_universal_checkpoint(opt2, m2, u, piece_bytes=8)
    assert [g["lr"] for g in opt2.param_groups] == [1e-2, 3e-3]
    _same(m2, opt2, ref, ref_opt)
    _steps([(m2, opt2), (ref, ref_opt)], 3, 2)
    _same(m2, opt2, ref, ref_opt)
    opt.close()
    opt2.close()


def test_files_torch_save_wrote_load_amsgrad(tmp_path):
    """A universal layout written with torch.save (ds_to_universal.py's way), not by strata."""
    ref = _net(0)
    ref_opt = torch.optim.Adam(_groups(ref), lr=1e-2, amsgrad=True)
    _steps([(ref, ref_opt)], 0, 2)
    zero = tmp_path / "u" / "zero"
    for n, p in ref.named_parameters():
        os.makedirs(zero / n)
        torch.save({"param": p.detach().clone(), "cat_dim": 0}, zero / n / "fp32.pt")
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            torch.save({"param": ref_opt.state[p][k].clone(), "cat_dim": 0}, zero / n / f"{k}.pt")
        torch.save(ref_opt.state[p]["step"].clone(), zero / n / "step.pt")
    groups = [{k: v for k, v in g.items() if k != "params"} for g in ref_opt.param_groups]
    for g, rg in zip(groups, ref_opt.param_groups):
        g["params"] = list(range(len(rg["params"])))
    torch.save({"param_groups": groups}, zero / "optimizer_state.pt")
    m = _net(5)
    opt = st.OffloadAdam(_groups(m), lr=0.1, amsgrad=True, path=str(tmp_path / "s"),
                         arithmetic="torch")
    st.load_universal_checkpoint(opt, m, tmp_path / "u")
    _same(m, opt, ref, ref_opt)
    _steps([(m, opt), (ref, ref_opt)], 2, 2)
    _same(m, opt, ref, ref_opt)
    opt.close()


def test_errors(tmp_path):
    m = _net(0)
    opt = st.OffloadAdamW(_groups(m), lr=1e-2, path=str(tmp_path / "a"), arithmetic="torch")
    _steps([(m, opt)], 0, 1)
    u = tmp_path / "u"
    st.save_universal_checkpoint(opt, m, u)
    with pytest.raises(TypeError, match="OffloadAdam"):
        st.save_universal_checkpoint(torch.optim.SGD(m.parameters(), lr=1), m, u)
    with pytest.raises(ValueError, match="not a parameter of the model"):
        st.save_universal_checkpoint(opt, torch.nn.Linear(2, 2), u)
    # another model shape
    other = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    o2 = st.OffloadAdamW(_groups(other), lr=1e-2, path=str(tmp_path / "b"))
    with pytest.raises(ValueError, match=r"0\.weight.*fp32\.pt.*shape \[5, 7\].*shape \[6, 7\]"):
        st.load_universal_checkpoint(o2, other, u)
    o2.close()
    # amsgrad other than the checkpoint's state streams
    m3 = _net(0)
    o3 = st.OffloadAdamW(_groups(m3), lr=1e-2, amsgrad=True, path=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="amsgrad"):
        st.load_universal_checkpoint(o3, m3, u)
    o3.close()
    # another number of groups
    m4 = _net(0)
    o4 = st.OffloadAdamW(m4.parameters(), lr=1e-2, path=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="number of parameter groups"):
        st.load_universal_checkpoint(o4, m4, u)
    o4.close()
    # a missing file; nothing written before the check
    m5 = _net(7)
    o5 = st.OffloadAdamW(_groups(m5), lr=0.5, path=str(tmp_path / "e"))
    before = [p.detach().clone() for p in m5.parameters()]
    os.remove(u / "zero" / "2.bias" / "exp_avg_sq.pt")
    with pytest.raises(FileNotFoundError, match=r"2\.bias.*exp_avg_sq\.pt"):
        st.load_universal_checkpoint(o5, m5, u)
    assert all(torch.equal(a, b) for a, b in zip(before, m5.parameters()))
    assert [g["lr"] for g in o5.param_groups] == [0.5, 3e-3]  # not the file's 1e-2
    o5.close()
    opt.close()
