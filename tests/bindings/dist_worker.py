"""One rank of the multi-process tests of strata.distributed (test_distributed.py starts it
under `strata launch` or torchrun). Usage: dist_worker.py SCENARIO [DIR]. Every check
asserts exact values; the last line of a rank that passed is "OK <scenario> rank <r>"."""
import os
import sys
import time

import numpy as np
import torch

import strata
import strata.distributed as sd


def check_eq(got, want, what):
    if isinstance(got, np.ndarray):
        ok = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    else:
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert ok, f"{what}: got {got!r}, want {want!r}"


def collectives(comm):
    r, n = comm.rank, comm.size
    # all_gather: torch, allocated out (concatenated along dim 0); numpy into a given out
    got = comm.all_gather(torch.arange(3, dtype=torch.float32) + 10 * r)
    check_eq(got, torch.cat([torch.arange(3, dtype=torch.float32) + 10 * k for k in range(n)]),
             "all_gather fp32")
    out = np.zeros((n, 2), dtype=np.int64)
    assert comm.all_gather(np.array([r, -r], dtype=np.int64), out) is out
    check_eq(out, np.array([[k, -k] for k in range(n)], dtype=np.int64), "all_gather int64")
    buf = torch.zeros(n * 2, dtype=torch.int32)
    buf[2 * r:2 * r + 2] = torch.tensor([r + 1, r + 2], dtype=torch.int32)
    comm.all_gather(buf[2 * r:2 * r + 2], buf)  # in place
    check_eq(buf, torch.tensor(sum([[k + 1, k + 2] for k in range(n)], []), dtype=torch.int32),
             "all_gather in place")
    # reduce_scatter: sum fp32 and max int32
    send = torch.arange(n * 4, dtype=torch.float32) * (r + 1)
    tri = n * (n + 1) // 2
    check_eq(comm.reduce_scatter(send), (torch.arange(n * 4, dtype=torch.float32) * tri)[4 * r:4 * r + 4],
             "reduce_scatter sum")
    send = torch.tensor([(k + 1) * (r + 1) if k % 2 else -r for k in range(2 * n)], dtype=torch.int32)
    out = torch.empty(2, dtype=torch.int32)
    comm.reduce_scatter(send, out, op="max")
    want = torch.tensor([(k + 1) * n if k % 2 else 0 for k in range(2 * n)], dtype=torch.int32)
    check_eq(out, want[2 * r:2 * r + 2], "reduce_scatter max")
    # all_reduce: bf16 sum (exact values), fp16 max, into out, numpy bf16 bits
    x = torch.tensor([1.5, -2.0, 256.0], dtype=torch.bfloat16) * (r + 1)
    assert comm.all_reduce(x) is x
    check_eq(x, torch.tensor([1.5, -2.0, 256.0], dtype=torch.bfloat16) * tri, "all_reduce bf16")
    h = torch.tensor([r, -r, 0.5], dtype=torch.float16)
    res = torch.empty(3, dtype=torch.float16)
    assert comm.all_reduce(h, "max", out=res) is res
    check_eq(res, torch.tensor([n - 1, 0, 0.5], dtype=torch.float16), "all_reduce fp16 max")
    check_eq(h, torch.tensor([r, -r, 0.5], dtype=torch.float16), "all_reduce input untouched")
    bits = np.full(4, 0x3F80, dtype=np.uint16)  # bf16 1.0
    comm.all_reduce(bits, dtype="bf16")
    want_bits = torch.full((4,), float(n), dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    check_eq(bits, want_bits, "all_reduce numpy bf16 bits")
    # broadcast from the last rank; barrier
    b = torch.full((4,), float(r))
    comm.broadcast(b, root=n - 1)
    check_eq(b, torch.full((4,), float(n - 1)), "broadcast")
    comm.barrier()
    # a blocking call releases the GIL: rank 0's thread runs while it waits for rank 1
    import threading
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
    th = threading.Thread(target=spin)
    th.start()
    if r == 1:
        time.sleep(0.5)
    comm.barrier()
    stop.set()
    th.join()
    assert ticks[0] > 1000, ticks[0]
    # several futures in flight, completed in issue order
    a = torch.ones(1000) * (r + 1)
    fa = comm.all_reduce_async(a)
    fb = comm.all_gather_async(torch.tensor([r]))
    fc = comm.barrier_async()
    check_eq(fb.result(timeout=30), torch.arange(n), "async all_gather")
    assert fa.result() is a and fc.result() is None
    check_eq(a, torch.full((1000,), float(tri)), "async all_reduce")


def _open_store(base, r):
    return strata.Store.open(os.path.join(base, f"rank{r}"), host_budget="64MiB",
                             staging="16MiB", chunk_size="1MiB", workers=2)


def partitioned(comm, base):
    r, n = comm.rank, comm.size
    g = torch.Generator().manual_seed(7)
    cases = {
        "fp32": torch.randn(1001, generator=g),
        "bf16": torch.randn(7, 5, generator=g).bfloat16(),  # 35 elements: odd
        "tiny": torch.tensor([3.25]),                        # numel < world size
        "scalar": torch.tensor(2.5, dtype=torch.float64),    # 0-d
        "empty": torch.empty(0, 4),
    }
    with _open_store(base, r) as store:
        for key, full in cases.items():
            comm.put_partitioned(store, key, full, tier="nvme" if key != "tiny" else "host")
            info = sd.stat_partitioned(store, key)
            begin, end = sd.partition_layout(full.numel(), n)[r]
            assert (info.owned_begin, info.owned_numel, info.numel, info.world_size, info.rank) == \
                (begin, end - begin, full.numel(), n, r), info
            assert info.shape == tuple(full.shape) and comm.owned_range(full.numel()) == (begin, end)
            out = torch.empty_like(full)
            assert comm.fetch_partitioned(store, key, out) is out
            check_eq(out.view(torch.uint8) if out.dim() else out, full.view(torch.uint8)
                     if full.dim() else full, f"round trip {key}")
        # numpy bf16 bits, small pieces (several pipeline steps)
        bits = (np.arange(4099, dtype=np.uint32) * 2654435761 % 65536).astype(np.uint16)
        comm.put_partitioned(store, "np", bits, dtype="bf16", piece_bytes=4096)
        assert sd.stat_partitioned(store, "np").dtype == "bf16"
        got = np.zeros_like(bits)
        comm.fetch_partitioned(store, "np", got, dtype="bf16", piece_bytes=4096, pipelined=False)
        check_eq(got, bits, "numpy bf16 round trip")
        # each rank passes only its slice
        full = torch.arange(11, dtype=torch.float32) * 1.25
        begin, end = comm.owned_range(11)
        comm.put_partitioned_slice(store, "slice", full[begin:end].clone(), (11,))
        # prefetch: two fetches and a collective in flight at once
        o1, o2 = torch.empty(11), torch.empty(1001)
        f1 = comm.fetch_partitioned_async(store, "slice", o1)
        f2 = comm.fetch_partitioned_async(store, "fp32", o2)
        s = torch.ones(3) * (r + 1)
        f3 = comm.all_reduce_async(s)
        assert f3.result() is s and f2.result() is o2 and f1.result() is o1
        check_eq(o1, full, "put_partitioned_slice round trip")
        check_eq(o2, cases["fp32"], "prefetched fp32")
        check_eq(s, torch.ones(3) * (n * (n + 1) // 2), "all_reduce between fetches")
        # reduce_scatter_grads: the sum over ranks, sliced by partition_layout
        for numel, dt in ((1001, torch.float32), (35, torch.bfloat16), (1, torch.float32)):
            grads = [torch.randn(numel, generator=torch.Generator().manual_seed(100 + k)).to(dt)
                     for k in range(n)]
            total = grads[0].float()
            for k in range(1, n):
                total = (total + grads[k].float()).to(dt).float()
            begin, end = sd.partition_layout(numel, n)[r]
            got = comm.reduce_scatter_grads(grads[r].reshape(numel))
            check_eq(got, total.to(dt)[begin:end], f"reduce_scatter_grads {dt} {numel}")
        g2 = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1)
        out = torch.full((comm.owned_range(6)[1] - comm.owned_range(6)[0],), -1.0)
        comm.reduce_scatter_grads(g2, out, op="max")
        b6, e6 = comm.owned_range(6)
        check_eq(out, (torch.arange(6, dtype=torch.float32) * n)[b6:e6], "reduce_scatter_grads max")
        # errors agreed by every rank; the communicator stays usable after them
        try:
            comm.fetch_partitioned(store, "missing", torch.empty(3))
            raise AssertionError("fetch of a missing key did not raise")
        except strata.NotFoundError as e:
            assert "missing" in str(e), e
        try:
            comm.fetch_partitioned(store, "fp32", torch.empty(1000))
            raise AssertionError("fetch with a wrong shape did not raise")
        except strata.InvalidArgumentError as e:
            assert "1001" in str(e) and "1000" in str(e), e
        try:
            comm.put_partitioned(store, "fp32", cases["fp32"])
            raise AssertionError("put over an existing key did not raise")
        except strata.AlreadyExistsError:
            pass
        comm.put_partitioned(store, "fp32", cases["fp32"] * 2, overwrite=True)
        out = torch.empty(1001)
        comm.fetch_partitioned(store, "fp32", out)
        check_eq(out, cases["fp32"] * 2, "overwrite")
        sd.remove_partitioned(store, "fp32")
        try:
            sd.stat_partitioned(store, "fp32")
            raise AssertionError("stat after remove did not raise")
        except KeyError:
            pass


def dead(comm):
    comm.barrier()
    if comm.rank == 1:
        os._exit(0)  # dies without closing anything
    time.sleep(0.3)
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1 << 16))
        raise AssertionError("all_reduce with a dead peer did not raise")
    except strata.UnavailableError as e:
        assert "rank 1" in str(e), e
    elapsed = time.monotonic() - t0
    assert elapsed < comm.timeout, elapsed
    try:
        comm.barrier()
        raise AssertionError("a broken communicator accepted a barrier")
    except strata.FailedPreconditionError:
        pass
    print(f"dead peer reported in {elapsed:.2f} s", flush=True)


def with_torch(base):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    tri = n * (n + 1) // 2
    own = sd.Communicator(timeout=20)      # its own rendezvous on MASTER_PORT + 1
    viat = sd.Communicator.from_torch()    # rendezvous agreed through torch's store
    group = dist.new_group(list(range(n)))
    viag = sd.Communicator.from_torch(group)
    assert (own.rank, own.size, viat.rank, viat.size, viag.rank) == (r, n, r, n, r)
    for i in range(3):
        t = torch.full((5,), float(r + 1 + i))
        dist.all_reduce(t)
        check_eq(t, torch.full((5,), float(tri + n * i)), "torch all_reduce")
        for c in (own, viat, viag):
            s = torch.full((5,), float(r + 1 + i))
            c.all_reduce(s)
            check_eq(s, torch.full((5,), float(tri + n * i)), "strata all_reduce beside torch")
        dist.barrier()
    with _open_store(base, r) as store:
        full = torch.randn(77, generator=torch.Generator().manual_seed(3))
        viat.put_partitioned(store, "w", full)
        out = torch.empty(77)
        own.fetch_partitioned(store, "w", out)
        check_eq(out, full, "fetch through the other communicator")
        grad = torch.arange(77, dtype=torch.float32) * (r + 1)
        begin, end = viat.owned_range(77)
        check_eq(viat.reduce_scatter_grads(grad), (torch.arange(77, dtype=torch.float32) * tri)[begin:end],
                 "reduce_scatter_grads via torch's rendezvous")
    for c in (own, viat, viag):
        c.close()
    t = torch.ones(2)
    dist.all_reduce(t)
    check_eq(t, torch.full((2,), float(n)), "torch after strata closed")
    dist.destroy_process_group()


def main():
    scenario = sys.argv[1]
    rank = int(os.environ["RANK"])
    if scenario == "torch":
        with_torch(sys.argv[2])
    else:
        with sd.Communicator(timeout=float(os.environ.get("DIST_TIMEOUT", "20"))) as comm:
            if scenario == "collectives":
                collectives(comm)
            elif scenario == "partitioned":
                partitioned(comm, sys.argv[2])
            elif scenario == "dead":
                dead(comm)
            else:
                raise SystemExit(f"unknown scenario {scenario}")
    print(f"OK {scenario} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
