"""One rank of test_safetensors_save_ranks.py: save_safetensors from ZeRO-3 partitioned
parameters (offload_parameters(comm=...)), every rank writing its own slices in place.

    python zero3_save_worker.py DIR    (under strata launch; DIR/big.safetensors holds the
                                       values of model(), written by the test)

Checks: the files (one file; shards with their index; converted to bf16) are byte-identical
to the one-process export of the same values from memory, and read back through the
independent reader (spec_files.py) with exactly the values; each rank wrote 45-55 % of the
tensor bytes (also data-parallel replicas given comm=); ranks given other arguments all
raise the same ValueError; a rank failing
mid-way makes every rank raise and leaves the earlier files as they were, no .tmp behind.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata  # noqa: E402
import strata.distributed as sd  # noqa: E402
import strata.torch as st  # noqa: E402
from strata.torch.checkpoints import _save, _save_ranks  # noqa: E402
import spec_files  # noqa: E402

AGREE = ("save_safetensors: rank 1's {} differs from rank 0's (every rank must call it with "
         "the same arguments and model)")
FAILED = ("save_safetensors: rank(s) [1] failed while writing its slices; nothing was "
          "renamed into place (the .tmp files are removed)")


def model():
    """Two Linear layers with a BatchNorm between (buffers: every rank holds them whole)."""
    return torch.nn.Sequential(torch.nn.Linear(96, 320), torch.nn.BatchNorm1d(320),
                               torch.nn.Linear(320, 72))


def files(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


def raises(exc, message, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert str(e) == message, (str(e), message)
        return
    raise AssertionError(f"{exc.__name__} not raised")


def fail_mid_way(rank, failed, fn, *args, **kwargs):
    """Runs ``fn`` on every rank with rank 1's second ``_save_ranks.write_elements`` failing
    (ENOSPC): rank 1 must raise that OSError, the others RuntimeError ``failed``."""
    real, calls = _save_ranks.write_elements, []

    def failing(*a):
        calls.append(1)
        if rank == 1 and len(calls) == 2:
            raise OSError(28, "No space left on device (injected)")
        return real(*a)
    _save_ranks.write_elements = failing
    try:
        if rank == 1:
            raises(OSError, "[Errno 28] No space left on device (injected)", fn, *args, **kwargs)
        else:
            raises(RuntimeError, failed, fn, *args, **kwargs)
    finally:
        _save_ranks.write_elements = real


def main():
    root = sys.argv[1]
    src = os.path.join(root, "big.safetensors")
    comm = sd.Communicator()
    rank = comm.rank
    store = strata.Store.open(os.path.join(root, f"rank{rank}"), chunk_size="64KiB")
    m = model()
    h = st.offload_parameters(m, store, working_set="64KiB", comm=comm)
    st.load_safetensors(m, src)
    _, want, _ = spec_files.read(src)
    plain = model()  # one process, in memory: the reference export
    plain.load_state_dict(want)
    runs = [("single", {}), ("shards", {"max_shard_size": "40KB"}),
            ("bf16", {"max_shard_size": "40KB", "dtype": torch.bfloat16})]
    for name, kw in runs:
        out = os.path.join(root, name)
        paths = st.save_safetensors(m, out, **kw)
        last = dict(_save.LAST_SAVE)
        assert last["rank"] == rank and last["world_size"] == 2, last
        share = last["rank_bytes"] / last["bytes"]
        assert 0.45 <= share <= 0.55, (name, last)
        if rank == 0:
            ref = os.path.join(root, name + "_ref")
            ref_paths = st.save_safetensors(plain, ref, **kw)
            assert [os.path.basename(p) for p in paths] == \
                [os.path.basename(p) for p in ref_paths], (paths, ref_paths)
            assert len(paths) == (1 if name == "single" else 4), paths
            assert files(out) == files(ref), name
            got = {}
            for p in paths:
                if p.endswith(".safetensors"):
                    got.update(spec_files.read(p)[1])
            assert sorted(got) == sorted(want), name
            for k, v in want.items():
                w = v.to(kw["dtype"]) if "dtype" in kw and v.is_floating_point() else v
                assert got[k].dtype == w.dtype and torch.equal(got[k], w), (name, k)
        print(f"rank {rank} {name}: wrote {last['rank_bytes']} of {last['bytes']} tensor "
              "bytes", flush=True)
        comm.barrier()
    # data-parallel replicas (the whole model in memory on every rank) given comm: a share each
    replicas = os.path.join(root, "replicas")
    st.save_safetensors(plain, replicas, max_shard_size="40KB", comm=comm)
    assert 0.45 <= _save.LAST_SAVE["rank_bytes"] / _save.LAST_SAVE["bytes"] <= 0.55
    if rank == 0:
        assert files(replicas) == files(os.path.join(root, "shards_ref"))
    comm.barrier()
    # ranks given other arguments: every rank raises the same error, nothing written
    other = os.path.join(root, "other" if rank else "single")
    raises(ValueError, AGREE.format("save_directory"), st.save_safetensors, m, other)
    raises(ValueError, AGREE.format("max_shard_size"), st.save_safetensors, m,
           os.path.join(root, "shards"), max_shard_size="40KB" if rank == 0 else "41KB")
    raises(ValueError, AGREE.format("metadata"), st.save_safetensors, m,
           os.path.join(root, "shards"), metadata={"format": "pt", "rank": str(rank)})
    # a rank failing mid-way (its second tensor): every rank raises; nothing appears under
    # a final name (a new directory stays empty), the earlier files stay (same inodes)
    shards = os.path.join(root, "shards")
    before = {f: (os.stat(os.path.join(shards, f)).st_ino, b)
              for f, b in files(shards).items()} if rank == 0 else None
    for out in (os.path.join(root, "failed"), shards):
        fail_mid_way(rank, FAILED, st.save_safetensors, m, out, max_shard_size="40KB")
    comm.barrier()
    if rank == 0:
        assert os.listdir(os.path.join(root, "failed")) == []
        assert {f: (os.stat(os.path.join(shards, f)).st_ino, b)
                for f, b in files(shards).items()} == before
    h.close()
    store.close()
    comm.close()
    print(f"OK zero3 save rank {rank}", flush=True)


if __name__ == "__main__":
    main()
