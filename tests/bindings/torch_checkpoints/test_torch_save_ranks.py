"""save_torch_state_dict from ZeRO-3 ranks, each writing its own slices of every storage in
place into one torch.load-able zip (no gather): 2 ranks under strata launch
(zero3_torch_save_worker.py: byte-identical to the one-process file, torch.load equal,
zipfile's CRC check, each rank 45-55 % of the bytes and only its own slices read, tied
weights once, fp32 and bf16, replicas with comm=, disagreeing ranks, a rank failing
mid-way); and, in one process, the CRC-32s a file's storages get from ranges combined
(crc32_combine) equal zlib's over the whole storage."""
import os
import subprocess
import sys
import zipfile
import zlib

import pytest
import torch

import strata.torch as st
from strata.distributed import partition_layout
from strata.torch.checkpoints._universal_zip import combined_crc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero3_torch_save_worker.py")


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_combined_crc_is_zlibs(size):
    data = torch.randn(1001, generator=torch.Generator().manual_seed(size)).bfloat16()
    raw = data.view(torch.int16).numpy().tobytes()
    ranges = [tuple(r) for r in partition_layout(1001, size)]
    crcs = [zlib.crc32(raw[b * 2:e * 2]) for b, e in ranges]
    assert combined_crc(crcs, ranges, 2) == zlib.crc32(raw)


def test_one_process_file_passes_zip_crc_check(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.BatchNorm1d(17))
    path = st.save_torch_state_dict(m, str(tmp_path / "m.pt"), piece_bytes=100)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        assert [i.filename for i in z.infolist()] == [
            "archive/data.pkl", "archive/byteorder"] + \
            [f"archive/data/{j}" for j in range(len(m.state_dict()))] + ["archive/version"]
    got = torch.load(path)
    for k, v in m.state_dict().items():
        assert torch.equal(got[k], v), k


def test_two_ranks_each_write_their_slices(tmp_path):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "100", "--", sys.executable, WORKER, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    _check_ranks(r, "zero3 torch save", range(2), lambda k: f"[rank {k}] ")
    print(r.stdout)
