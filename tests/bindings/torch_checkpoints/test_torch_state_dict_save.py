"""strata.torch.save_torch_state_dict: torch.load reads what it writes as what torch.save of
the same state dict gives (values, dtypes, shapes, tied tensors sharing a storage, module
versions), from plain and offloaded models, with storages 64-byte aligned as torch's
writer aligns them; it round-trips through load_torch_state_dict."""
import os
import struct
import sys
import zipfile

import torch

import strata.torch as st

sys.path.insert(0, os.path.dirname(__file__))
from test_safetensors_load import Net  # noqa: E402
from test_torch_state_dict_load import filled_net, same  # noqa: E402


def check_like_torch_save(path, model, tmp_path):
    torch.save(model.state_dict(), tmp_path / "ref.pt")
    ref, got = torch.load(tmp_path / "ref.pt"), torch.load(path)
    assert list(got) == list(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k
    assert got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()  # one storage
    assert got._metadata == ref._metadata
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for i in z.infolist():
            assert i.compress_type == zipfile.ZIP_STORED
            f.seek(i.header_offset + 26)
            n, m = struct.unpack("<HH", f.read(4))
            if "/data/" in i.filename:
                assert (i.header_offset + 30 + n + m) % 64 == 0, i.filename


def test_plain_model_reads_back_with_torch_load(tmp_path):
    m = filled_net(1)
    path = st.save_torch_state_dict(m, str(tmp_path / "m.pt"), piece_bytes=1000)
    assert path == str(tmp_path / "m.pt") and not os.path.exists(path + ".tmp")
    check_like_torch_save(path, m, tmp_path)


def test_offloaded_model_and_round_trip(tmp_path, store):
    m = filled_net(2)
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    with st.offload_parameters(m, store, working_set="32KiB") as h:
        path = st.save_torch_state_dict(h, str(tmp_path / "o.pt"), piece_bytes="4KiB")
        got = torch.load(path)
        for k, v in ref.items():
            assert torch.equal(got[k], v), k
    check_like_torch_save(path, m, tmp_path)
    back = Net()
    assert tuple(st.load_torch_state_dict(back, path)) == ([], [])
    same(back, m)
