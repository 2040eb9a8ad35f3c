"""One rank of test_safetensors_ranks.py: load_safetensors into ZeRO-3 partitioned
parameters (offload_parameters(comm=...)): each rank's store holds exactly its slice of the
file's values, it read only about its share of the file, the whole values (fetched
collectively) and the buffers equal the file's.

    python zero3_load_worker.py DIR     (under strata launch; DIR/m.safetensors holds Net's
                                        values, DIR/big.safetensors two Linear layers')
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from strata.torch.checkpoints import _load  # noqa: E402
import spec_files  # noqa: E402
from test_safetensors_load import Net, expected  # noqa: E402


def main():
    root = sys.argv[1]
    path = os.path.join(root, "m.safetensors")
    comm = sd.Communicator()
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), chunk_size="64KiB")
    model = Net()
    h = st.offload_parameters(model, store, working_set="64KiB", comm=comm)
    assert tuple(st.load_safetensors(model, path)) == ([], [])
    _, vals, data_start = spec_files.read(path)
    want = expected(vals, Net())
    for n, p in h.parameters:
        b, e = comm.owned_range(p.numel())
        got = h.read_state(p)  # this rank's slice, from its store (no collective)
        assert got.numel() == h.state_numel(p) == e - b < p.numel(), n
        assert torch.equal(got, want[n].reshape(-1)[b:e]), n
    # a larger file: each rank reads about its half (the aligned supersets add < 4 KiB a
    # tensor)
    big = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
    hb = st.offload_parameters(big, store, working_set="64KiB", comm=comm, key_prefix="big/")
    st.load_safetensors(big, os.path.join(root, "big.safetensors"))
    _, bvals, bstart = spec_files.read(os.path.join(root, "big.safetensors"))
    data = os.path.getsize(os.path.join(root, "big.safetensors")) - bstart
    read = _load.LAST_LOAD["bytes"]
    assert 0.45 * data < read < 0.55 * data, (read, data)
    for n, p in hb.parameters:
        assert torch.equal(hb.read(p), bvals[n]), n
    hb.close()
    for n, p in h.parameters:  # the whole values, fetched from both ranks' slices
        assert torch.equal(h.read(p), want[n]), n
    for n, buf in model.named_buffers():
        assert torch.equal(buf, want[n]), n
    h.close()
    store.close()
    comm.close()
    print(f"OK zero3 load rank {rank} read {read} of {data} bytes", flush=True)


if __name__ == "__main__":
    main()
