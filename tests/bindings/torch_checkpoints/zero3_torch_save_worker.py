"""One rank of test_torch_save_ranks.py: save_torch_state_dict from ZeRO-3 partitioned
parameters (offload_parameters(comm=...)), every rank writing its own slices of each
storage in place into one torch.load-able zip.

    python zero3_torch_save_worker.py DIR    (under strata launch)

Checks, for an fp32 and a bf16 model with tied weights and buffers: the file is
byte-identical to the one-process save_torch_state_dict of the same values from memory;
torch.load gives torch.equal tensors (the tied pair on one storage, stored once); zipfile's
testzip passes every CRC-32 (combined from the ranks' pieces); each rank wrote 45-55 % of
the tensor bytes and read only its own ``#part`` objects, a piece at a time; data-parallel
replicas given comm= write the same file; ranks given other arguments all raise the same
ValueError; a rank failing mid-way makes every rank raise, leaves no file under a new name
and an earlier file as it was (same inode and bytes), no .tmp behind.
"""
import copy
import os
import sys
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from strata.torch.checkpoints import _save  # noqa: E402
from zero3_save_worker import fail_mid_way, raises  # noqa: E402

AGREE = ("save_torch_state_dict: rank 1's {} differs from rank 0's (every rank must call it "
         "with the same arguments and model)")
FAILED = ("save_torch_state_dict: rank(s) [1] failed while writing its slices; nothing was "
          "renamed into place (the .tmp files are removed)")
PIECE = 4096


class Net(torch.nn.Module):
    """Tied embedding / head, a Linear with bias, BatchNorm buffers (float and int64)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(96, 64)
        self.fc = torch.nn.Linear(64, 160)
        self.bn = torch.nn.BatchNorm1d(160)
        self.head = torch.nn.Linear(64, 96, bias=False)
        self.head.weight = self.emb.weight


def model(dtype):
    torch.manual_seed(5)
    m = Net().to(dtype)
    with torch.no_grad():
        m.bn.running_mean.normal_()
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.num_batches_tracked.fill_(7)
    return m


def check_file(path, plain):
    """torch.load of ``path`` gives ``plain``'s state dict exactly; CRCs pass; tied once."""
    want = plain.state_dict()
    got = torch.load(path)
    assert list(got) == list(want), (list(got), list(want))
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()
    assert got._metadata == want._metadata
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        storages = [n for n in z.namelist() if "/data/" in n]
    assert len(storages) == len(want) - 1, storages  # the tied head stored once


def main():
    root = sys.argv[1]
    comm = sd.Communicator()
    rank = comm.rank
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        store = strata.Store.open(os.path.join(root, f"rank{rank}_{name}"), chunk_size="64KiB")
        m = model(dtype)
        plain = copy.deepcopy(m)  # one process, in memory: the reference
        h = st.offload_parameters(m, store, working_set="64KiB", comm=comm)
        reads, real_read = [], store.read_range

        def read_range(key, offset, n, real_read=real_read, reads=reads):
            reads.append((key, offset, n))
            return real_read(key, offset, n)
        store.read_range = read_range
        path = os.path.join(root, name + ".pt")
        assert st.save_torch_state_dict(m, path, piece_bytes=PIECE) == path
        del store.read_range
        last = dict(_save.LAST_SAVE)
        assert last["rank"] == rank and last["world_size"] == 2, last
        assert 0.45 <= last["rank_bytes"] / last["bytes"] <= 0.55, (name, last)
        assert reads and all(k.endswith("#part") and n <= PIECE for k, _o, n in reads), reads
        if rank == 0:
            ref = os.path.join(root, name + "_ref.pt")
            st.save_torch_state_dict(plain, ref, piece_bytes=PIECE)
            assert _save.LAST_SAVE["rank_bytes"] == _save.LAST_SAVE["bytes"] == last["bytes"]
            assert open(path, "rb").read() == open(ref, "rb").read(), name
            check_file(path, plain)
        print(f"rank {rank} {name}: wrote {last['rank_bytes']} of {last['bytes']} tensor "
              "bytes", flush=True)
        comm.barrier()
        if name == "fp32":
            # data-parallel replicas (the whole model in memory on every rank) given comm
            replicas = os.path.join(root, "replicas.pt")
            st.save_torch_state_dict(plain, replicas, comm=comm)
            assert 0.45 <= _save.LAST_SAVE["rank_bytes"] / _save.LAST_SAVE["bytes"] <= 0.55
            if rank == 0:
                assert open(replicas, "rb").read() == open(path, "rb").read()
            comm.barrier()
            errors(root, m, path, rank, comm)
        h.close()
        store.close()
    comm.close()
    print(f"OK zero3 torch save rank {rank}", flush=True)


def errors(root, m, path, rank, comm):
    """Disagreeing ranks, a rank failing mid-way (into a new file and over ``path``)."""
    other = os.path.join(root, "other.pt" if rank else "fp32.pt")
    raises(ValueError, AGREE.format("path"), st.save_torch_state_dict, m, other)
    raises(ValueError, AGREE.format("durable"), st.save_torch_state_dict, m, path,
           durable=rank == 0)
    assert not os.path.exists(os.path.join(root, "other.pt"))
    before = (os.stat(path).st_ino, open(path, "rb").read()) if rank == 0 else None
    for out in (os.path.join(root, "failed.pt"), path):
        fail_mid_way(rank, FAILED, st.save_torch_state_dict, m, out, piece_bytes=PIECE)
    comm.barrier()
    if rank == 0:
        assert not os.path.exists(os.path.join(root, "failed.pt"))
        assert (os.stat(path).st_ino, open(path, "rb").read()) == before
        assert not [f for f in os.listdir(root) if f.endswith(".tmp")], os.listdir(root)


if __name__ == "__main__":
    main()
