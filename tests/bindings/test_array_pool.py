"""The array pool (bindings/python/src/array_pool.hpp): a buffer Store.get made is reused
for the next array of the same size only once nothing references it, within the capacity
reserved (strata.torch's parameter offload reserves its working-set budget while open).
Exact counts and addresses; the pool is process-wide, so each test starts from its own
reservation and compares counters before and after."""

import numpy as np
import pytest
import torch

import strata
from strata import _strata

MIB = 1 << 20


def _addr(a):
    return a.__array_interface__["data"][0]


def _reserved(n):
    class R:
        def __enter__(self):
            _strata._array_pool_reserve(n)
            return self

        def __exit__(self, *exc):
            _strata._array_pool_reserve(-n)
    return R()


def test_a_freed_buffer_is_reused_for_the_next_get_of_its_size(store):
    store.put("a", np.arange(MIB // 4, dtype=np.float32))
    store.put("b", np.full(MIB // 4, 7, dtype=np.float32))
    with _reserved(4 * MIB):
        x = store.get("a")
        where = _addr(x)
        del x  # last reference: kept by the pool
        s0 = _strata._array_pool_stats()
        assert s0["held_bytes"] == MIB and s0["held_blocks"] == 1
        y = store.get("b")
        s1 = _strata._array_pool_stats()
        assert _addr(y) == where
        assert s1["hits"] == s0["hits"] + 1 and s1["held_bytes"] == 0
        assert np.array_equal(y, np.full(MIB // 4, 7, dtype=np.float32))
    assert _strata._array_pool_stats()["capacity_bytes"] == 0


def test_a_buffer_a_view_still_sees_is_not_reused(store):
    store.put("a", np.arange(MIB // 4, dtype=np.float32))
    store.put("b", np.full(MIB // 4, 7, dtype=np.float32))
    with _reserved(4 * MIB):
        x = store.get_tensor("a")
        view = x[10:20]  # a torch view keeps the numpy array, hence the buffer
        where = view.data_ptr() - 40
        del x
        assert _strata._array_pool_stats()["held_bytes"] == 0
        y = store.get("b")
        assert _addr(y) != where
        assert view.tolist() == [float(i) for i in range(10, 20)]
        del y
    assert _strata._array_pool_stats()["held_bytes"] == 0  # given back with the capacity


def test_the_pool_holds_at_most_its_capacity_oldest_freed_first(store):
    for k in "abc":
        store.put(k, np.zeros(MIB // 4, dtype=np.float32))
    store.put("two", np.zeros(2 * MIB // 4, dtype=np.float32))
    with _reserved(2 * MIB):
        arrays = [store.get(k) for k in "abc"]
        addrs = [_addr(a) for a in arrays]
        while arrays:  # three 1 MiB blocks freed in order a, b, c: a's is dropped
            arrays.pop(0)
        s = _strata._array_pool_stats()
        assert s["held_bytes"] == 2 * MIB and s["held_blocks"] == 2
        h0 = s["hits"]
        got = store.get("c")  # the most recently freed block of its size first
        assert _addr(got) == addrs[2]
        other = store.get("two")  # no 2 MiB block: a miss, a new buffer
        assert _strata._array_pool_stats()["hits"] == h0 + 1
        del got, other
        s = _strata._array_pool_stats()
        # the 2 MiB block evicts the 1 MiB blocks freed before it
        assert s["held_bytes"] == 2 * MIB and s["held_blocks"] == 1
    s = _strata._array_pool_stats()
    assert s["held_bytes"] == 0 and s["capacity_bytes"] == 0


def test_small_arrays_and_no_capacity_are_not_pooled(store):
    store.put("small", np.zeros(1000, dtype=np.float32))
    store.put("big", np.zeros(MIB // 4, dtype=np.float32))
    with _reserved(4 * MIB):
        del_small = store.get("small")
        del del_small  # 4 KiB: below the 64 KiB floor
        assert _strata._array_pool_stats()["held_bytes"] == 0
    x = store.get("big")
    del x  # no capacity reserved
    assert _strata._array_pool_stats()["held_bytes"] == 0


def test_parameter_offload_reserves_its_working_set_while_open(tmp_path):
    import strata.torch as st
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    ref = [p.detach().clone() for p in model.parameters()]
    x = torch.ones(1, 256)
    with torch.no_grad():
        want = model(x)
    before = _strata._array_pool_stats()["capacity_bytes"]
    # 300 KiB: one 256 KiB weight at a time, so every forward fetches both weights again;
    # on demand (no prefetch thread), so each fetch comes after the eviction that frees
    # the other weight's buffer (a prefetch may race it and take a new one)
    handle = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=300 << 10,
                                   prefetch=False)
    assert _strata._array_pool_stats()["capacity_bytes"] == before + (300 << 10)
    with torch.no_grad():
        model(x)
    s0, f0 = _strata._array_pool_stats(), handle.stats()["bytes_fetched"]
    for _ in range(3):
        with torch.no_grad():
            assert torch.equal(model(x), want)
    s1, f1 = _strata._array_pool_stats(), handle.stats()["bytes_fetched"]
    assert f1 - f0 == 6 * (256 << 10)  # the weights, thrice each (the biases stay)
    assert s1["misses"] == s0["misses"]  # every one into a kept buffer
    assert s1["hits"] - s0["hits"] == 6
    assert all(torch.equal(handle.read(p), r) for (_, p), r in zip(handle.parameters, ref))
    handle.close()
    assert _strata._array_pool_stats()["capacity_bytes"] == before


def test_fork_while_another_thread_uses_the_pool_leaves_the_child_a_usable_pool(store):
    """The pool's lock is held across fork (pthread_atfork): a child forked while the fetch
    thread takes or gives a buffer can still free and get arrays (a DataLoader worker
    dropping an inherited array), where a lock copied held would hang it."""
    import os
    import threading
    import time
    store.put("a", np.arange(MIB // 4, dtype=np.float32))
    with _reserved(4 * MIB):
        stop = threading.Event()

        def churn():
            while not stop.is_set():
                x = store.get("a")
                del x

        inherited = store.get("a")
        t = threading.Thread(target=churn)
        t.start()
        try:
            codes = []
            for _ in range(20):
                box = [store.get("a")]  # its only reference
                pid = os.fork()
                if pid == 0:  # child: free an inherited array (into the pool), use the pool
                    try:
                        box.clear()
                        _strata._array_pool_reserve(-MIB)
                        _strata._array_pool_stats()
                        os._exit(0)
                    except BaseException:  # noqa: BLE001
                        os._exit(1)
                box.clear()
                deadline = time.monotonic() + 20
                while True:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes.append(os.waitstatus_to_exitcode(status))
                        break
                    if time.monotonic() > deadline:
                        os.kill(pid, 9)
                        os.waitpid(pid, 0)
                        codes.append("hung")
                        break
                    time.sleep(0.01)
        finally:
            stop.set()
            t.join()
        assert codes == [0] * 20
        assert np.array_equal(inherited, np.arange(MIB // 4, dtype=np.float32))
