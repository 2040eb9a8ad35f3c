"""save_safetensors from ZeRO-3 ranks, each writing its own slices in place (no gather):
2 ranks under strata launch (zero3_save_worker.py: byte-identical to the one-process
export, read back exactly by spec_files.py, each rank 45-55 % of the bytes, ranks
disagreeing, a rank failing mid-way); and the header the ranks compute in Python is the
C++ writer's, byte for byte, for awkward names, every dtype and metadata."""
import os
import subprocess
import sys

import pytest
import torch

from strata import _strata
from strata.torch.checkpoints._entries import STRATA_OF_TORCH
from strata.torch.checkpoints._save_ranks import ST_OF_TORCH, header_of

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _check_ranks, _free_port_pair, _strata_cli  # noqa: E402
import spec_files  # noqa: E402
from zero3_save_worker import model  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero3_save_worker.py")


@pytest.mark.parametrize("metadata", [{}, {"format": "pt", "z\u00e9\"\\\n": "\x01\u2028"}])
def test_header_is_the_cpp_writers(tmp_path, metadata):
    g = torch.Generator().manual_seed(3)
    tensors = {"b.w": torch.randn(3, 5, generator=g), "a": torch.randn(7, generator=g).half(),
               "\u00e9t\u00e9": torch.randn(2, 2, generator=g).bfloat16(),
               "q\"uo\\te\t": torch.arange(5, dtype=torch.int64),
               "Z": torch.tensor(True), "ctrl\x1f\x7f": torch.arange(4, dtype=torch.int8),
               "u8": torch.arange(3, dtype=torch.uint8), "i16": torch.arange(3, dtype=torch.int16),
               "i32": torch.arange(9, dtype=torch.int32), "f64": torch.randn(0, 3).double(),
               "__x": torch.randn(1, generator=g)}
    sources = [(k, STRATA_OF_TORCH[v.dtype], list(v.shape), STRATA_OF_TORCH[v.dtype],
                v.data_ptr() if v.numel() else None, None, 0) for k, v in tensors.items()]
    path = str(tmp_path / "m.safetensors")
    _strata.safetensors_write(path, sources, metadata, None, None, None, False)
    header, offsets = header_of([(k, ST_OF_TORCH[v.dtype], list(v.shape),
                                  v.numel() * v.element_size()) for k, v in tensors.items()],
                                metadata)
    data = open(path, "rb").read()
    assert data[:len(header)] == header
    assert len(header) % 4096 == 0 and len(data) == len(header) + max(e for _b, e in offsets.values())
    for k, v in tensors.items():
        b, e = offsets[k]
        assert data[len(header) + b:len(header) + e] == spec_files.tensor_bytes(v), k


def test_two_ranks_each_write_their_slices(tmp_path):
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    torch.manual_seed(11)
    m = model()
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2)
        m[1].num_batches_tracked.fill_(7)
    spec_files.write(tmp_path / "big.safetensors", dict(m.state_dict()))
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "100", "--", sys.executable, WORKER, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    _check_ranks(r, "zero3 save", range(2), lambda k: f"[rank {k}] ")
    print(r.stdout)
