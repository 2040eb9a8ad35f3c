"""strata.torch.load_torch_state_dict: files written by torch.save itself load with exactly
the values torch.load gives, into plain and offloaded models (views at storage offsets,
tied storages, dtype conversion, a checkpoint dict's "model"), keys and errors as
load_state_dict's, without running the file's code (restricted unpickler) and with errors
naming the file and entry for what it does not read."""
import copy
import os
import sys
import zipfile

import pytest
import torch

import strata.torch as st

sys.path.insert(0, os.path.dirname(__file__))
from test_safetensors_load import Net  # noqa: E402


def filled_net(seed):
    torch.manual_seed(seed)
    m = Net()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
        m.bn.running_mean.normal_()
        m.bn.num_batches_tracked.fill_(11)
    return m


def same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def test_torch_save_state_dict_loads_plain_and_offloaded(tmp_path, store):
    src = filled_net(1)
    torch.save(src.state_dict(), tmp_path / "sd.pt")  # head.weight shares emb's storage
    plain = Net()
    assert tuple(st.load_torch_state_dict(plain, str(tmp_path / "sd.pt"))) == ([], [])
    same(plain, src)
    off = Net()
    with st.offload_parameters(off, store, working_set="32KiB") as h:
        res = st.load_torch_state_dict(h, str(tmp_path / "sd.pt"))
        assert tuple(res) == ([], [])
        same(off, src)
    torch.save({"model": src.state_dict(), "step": 7, "opt": {"lr": 0.1}}, tmp_path / "ck.pt")
    other = Net()
    st.load_torch_state_dict(other, str(tmp_path / "ck.pt"), key="model")
    same(other, src)
    with pytest.raises(ValueError, match="the object saved is not a state dict"):
        st.load_torch_state_dict(Net(), str(tmp_path / "ck.pt"))


def test_views_at_offsets_and_conversion_match_torch_load(tmp_path):
    big = torch.randn(1000)
    sd = {"fc.bias": big[100:140], "bn.weight": big[7:47], "bn.bias": big[500:540].bfloat16()}
    torch.save(sd, tmp_path / "v.pt")
    ref = torch.load(tmp_path / "v.pt")
    m = Net()
    twin = copy.deepcopy(m)
    with torch.no_grad():
        m.bn.num_batches_tracked.fill_(3)
        twin.bn.num_batches_tracked.fill_(3)
    res = st.load_torch_state_dict(m, str(tmp_path / "v.pt"), strict=False)
    want = twin.load_state_dict(ref, strict=False)
    # emb.weight and its tied head.weight are both missing (neither name is in the file);
    # the BatchNorm's num_batches_tracked is filled by torch itself (a plain dict)
    assert res.missing_keys == want.missing_keys
    assert res.unexpected_keys == want.unexpected_keys == []
    same(m, twin)
    assert torch.equal(m.fc.bias, ref["fc.bias"])
    assert torch.equal(m.bn.weight, ref["bn.weight"])
    assert torch.equal(m.bn.bias, ref["bn.bias"].float())  # bf16 storage into fp32


def test_size_mismatch_as_torch(tmp_path):
    sd = filled_net(2).state_dict()
    sd["fc.bias"] = torch.zeros(41)
    torch.save(sd, tmp_path / "m.pt")
    with pytest.raises(RuntimeError) as torch_err:
        Net().load_state_dict(torch.load(tmp_path / "m.pt"))
    with pytest.raises(RuntimeError) as ours:
        st.load_torch_state_dict(Net(), str(tmp_path / "m.pt"))
    assert str(ours.value) == str(torch_err.value)


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {Evil.marker}",))


def test_no_code_from_the_file_runs(tmp_path):
    Evil.marker = str(tmp_path / "ran")
    torch.save({"fc.bias": torch.zeros(40), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match=r"data.pkl needs (posix|os)\.system, which a state dict "
                       "does not"):
        st.load_torch_state_dict(Net(), str(tmp_path / "evil.pt"), strict=False)
    assert not os.path.exists(Evil.marker)


def test_what_is_not_read_is_named(tmp_path):
    sd = {"fc.weight": torch.zeros(24, 40).t()}
    torch.save(sd, tmp_path / "t.pt")
    with pytest.raises(ValueError, match=r"tensor 'fc.weight' is a non-contiguous view"):
        st.load_torch_state_dict(Net(), str(tmp_path / "t.pt"), strict=False)
    torch.save({"fc.bias": torch.zeros(40)}, tmp_path / "old.pt",
               _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="is not a zip archive .*legacy"):
        st.load_torch_state_dict(Net(), str(tmp_path / "old.pt"), strict=False)
    torch.save({"fc.bias": torch.zeros(40)}, tmp_path / "ok.pt")
    with zipfile.ZipFile(tmp_path / "ok.pt") as zin, \
            zipfile.ZipFile(tmp_path / "z.pt", "w", zipfile.ZIP_DEFLATED) as zout:
        for i in zin.infolist():
            zout.writestr(i.filename, zin.read(i))
    with pytest.raises(ValueError, match=r"entry 'ok/data/0' is compressed"):
        st.load_torch_state_dict(Net(), str(tmp_path / "z.pt"), strict=False)


def test_damaged_archives_raise_named_errors_only(tmp_path):
    """300 seeded mutations of a real torch.save file (bytes flipped, truncations, both):
    each loads or raises a ValueError / UnpicklingError / strata error / torch's
    RuntimeError or TypeError naming what is wrong -- nothing else, and no code runs."""
    import pickle
    import random

    import strata
    Evil.marker = str(tmp_path / "ran")
    torch.save(filled_net(5).state_dict(), tmp_path / "ok.pt")
    good = (tmp_path / "ok.pt").read_bytes()
    rng = random.Random(27)
    allowed = (ValueError, pickle.UnpicklingError, strata.Error, RuntimeError, TypeError)
    outcomes = {}
    for i in range(300):
        data = bytearray(good)
        if i % 3 != 1:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        if i % 3 != 0:
            del data[rng.randrange(len(data)):]
        path = tmp_path / "m.pt"
        path.write_bytes(bytes(data))
        try:
            st.load_torch_state_dict(Net(), str(path), strict=False)
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
        except allowed as e:
            assert "m.pt" in str(e) or isinstance(e, (RuntimeError, TypeError)), repr(e)
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
    assert not os.path.exists(Evil.marker)
    assert len(outcomes) >= 2, outcomes
