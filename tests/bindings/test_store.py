"""strata.Store from Python: round trips per dtype and tier, metadata, movement, futures."""
import os
import sqlite3

import numpy as np
import pytest
import torch

import strata

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.bool_]
NAMES = {np.float32: "fp32", np.float16: "fp16", np.float64: "fp64", np.int8: "int8",
         np.int16: "int16", np.int32: "int32", np.int64: "int64", np.uint8: "uint8",
         np.bool_: "bool"}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: NAMES[d])
@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_round_trip_every_dtype(store, dtype, tier):
    a = (np.arange(3 * 5 * 7) % 11).astype(dtype).reshape(3, 5, 7)
    store.put("x", a, tier=tier)
    info = store.stat("x")
    assert info.dtype == NAMES[dtype]
    assert info.shape == (3, 5, 7)
    assert info.nbytes == a.nbytes
    assert info.tier == tier
    b = store.get("x")
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def test_scalar_and_empty(store):
    store.put("s", np.array(3.5, dtype=np.float32))
    assert store.stat("s").shape == ()
    assert store.get("s").item() == 3.5
    store.put("e", np.zeros((0, 4), dtype=np.int32))
    assert store.get("e").shape == (0, 4)


def test_multi_chunk_object_survives_reopen(store_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(3 * 262144 + 17).astype(np.float32)  # > 3 chunks of 1 MiB
    with strata.Store.open(store_path, host_budget="64MiB", staging="16MiB",
                           chunk_size="1MiB") as s:
        s.put("big", a)
        assert s.stat("big").num_chunks == 4
    with strata.Store.open(store_path, host_budget="64MiB", staging="16MiB") as s:
        np.testing.assert_array_equal(s.get("big"), a)


def test_torch_tensors_and_bf16(store):
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    store.put("t", t)
    assert store.stat("t").dtype == "fp32"
    assert torch.equal(store.get_tensor("t"), t)
    tb = torch.linspace(-3, 3, 100).to(torch.bfloat16)
    store.put("tb", tb, tier="host")
    assert store.stat("tb").dtype == "bf16"
    back = store.get_tensor("tb")
    assert back.dtype == torch.bfloat16 and torch.equal(back, tb)
    # numpy sees bf16 as its uint16 bits
    bits = store.get("tb")
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, tb.view(torch.int16).numpy().view(np.uint16))
    # a tensor that requires grad is exported through a detached view
    w = torch.ones(5, requires_grad=True)
    store.put("w", w)
    np.testing.assert_array_equal(store.get("w"), np.ones(5, dtype=np.float32))
    # uint16 numpy array stored as bf16 by override
    store.put("b2", bits, dtype="bf16")
    assert store.stat("b2").dtype == "bf16"


def test_keys_list_contains_delete(store):
    for k in ["b/2", "a/1", "b/1"]:
        store.put(k, np.zeros(4, dtype=np.float32))
    assert store.keys() == ["a/1", "b/1", "b/2"]
    assert store.keys("b/") == ["b/1", "b/2"]
    assert [i.key for i in store.list("a/")] == ["a/1"]
    assert "a/1" in store and "zz" not in store
    assert len(store) == 3
    store.delete("a/1")
    assert store.keys() == ["b/1", "b/2"]
    store.delete_async("b/1").result(timeout=30)
    assert store.keys() == ["b/2"]


def test_move_prefetch_evict_pin(store):
    a = np.arange(1000, dtype=np.int64)
    store.put("m", a, tier="nvme")
    store.prefetch("m")
    assert store.stat("m").tier == "host"
    store.evict("m")
    assert store.stat("m").tier == "nvme"
    store.move("m", "host")
    assert store.stat("m").tier == "host"
    store.move_async("m", "nvme").result(timeout=30)
    assert store.stat("m").tier == "nvme"
    store.prefetch_async("m", "host").result(timeout=30)
    store.pin("m")
    assert store.stat("m").pinned
    store.unpin("m")
    assert not store.stat("m").pinned
    np.testing.assert_array_equal(store.get("m"), a)


def test_async_put_get_and_futures(store):
    arrays = {f"k{i}": np.full(50000, i, dtype=np.float32) for i in range(8)}
    futs = [store.put_async(k, v) for k, v in arrays.items()]
    for f in futs:
        assert f.result(timeout=60) is None
        assert f.done()
    gets = {k: store.get_async(k) for k in arrays}
    for k, f in gets.items():
        np.testing.assert_array_equal(f.result(timeout=60), arrays[k])
    out = np.empty(50000, dtype=np.float32)
    f = store.get_into_async("k3", out)
    assert f.result(timeout=60) is out
    assert (out == 3).all()
    assert f.exception() is None
    pending = store.get_async("k0")
    store.flush_async().result(timeout=60)
    np.testing.assert_array_equal(pending.result(), arrays["k0"])


def test_overwrite_and_ranges(store):
    store.put("r", np.zeros(16, dtype=np.uint8))
    store.put("r", np.arange(16, dtype=np.uint8), overwrite=True)
    np.testing.assert_array_equal(store.read_range("r", 4, 3), np.array([4, 5, 6], np.uint8))
    store.write_range("r", 2, np.array([200, 201], dtype=np.uint8))
    np.testing.assert_array_equal(store.get("r")[:5], np.array([0, 1, 200, 201, 4], np.uint8))


def test_sizes_and_usage(store):
    assert strata.parse_size("1GiB") == 1 << 30
    assert strata.parse_size("64M") == 64 << 20
    store.put("u", np.zeros(1024, dtype=np.float32), tier="host")
    u = store.usage()
    assert u["objects"] == 1
    assert u["host_budget_bytes"] == 64 << 20
    assert u["host_bytes"] >= 4096


def _edit_catalog(store_path, *statements):
    """Runs SQL `statements` (each a str, or a (str, parameters) pair) on the SQLite catalog
    of the closed store at `store_path`, as another program (or damage) would, and commits."""
    db = sqlite3.connect(os.path.join(store_path, "catalog.db"))
    try:
        for statement in statements:
            db.execute(*((statement,) if isinstance(statement, str) else statement))
        db.commit()
    finally:
        db.close()


def test_keys_that_are_not_utf8_are_listed_with_surrogateescape(store_path):
    """A key that is not valid UTF-8 (renamed in the SQLite catalog: written by another
    program, or damaged) lists as os.fsdecode would show it, never UnicodeDecodeError."""
    opts = dict(host_budget="16MiB", staging="4MiB", chunk_size="1MiB", workers=1)
    with strata.Store.open(store_path, **opts) as s:
        s.put("k", np.arange(4, dtype=np.int32))
    _edit_catalog(store_path, *[(f"UPDATE {table} SET key=? WHERE key=CAST('k' AS BLOB)",
                                 (b"bad\xffkey",)) for table in ("objects", "chunks")])
    with strata.Store.open(store_path, **opts) as s:
        assert s.keys() == ["bad\udcffkey"]
        assert [i.key for i in s.list()] == ["bad\udcffkey"]
        assert len(s) == 1


def test_damaged_catalog_row_is_reported_in_object_info(store_path):
    """A damaged catalog row (nbytes edited in the SQLite catalog, as tests/store does) is
    listed with ObjectInfo.damage; reading it is DataLossError; overwriting repairs it."""
    good = np.arange(10, dtype=np.float32)
    bad = np.arange(6, dtype=np.int32)
    opts = dict(host_budget="16MiB", staging="4MiB", chunk_size="1MiB", workers=1)
    with strata.Store.open(store_path, **opts) as s:
        s.put("good", good)
        s.put("bad", bad)
        s.put("huge", bad)
        assert s.stat("good").damage == ""
    _edit_catalog(store_path,
                  "UPDATE objects SET nbytes=-16 WHERE key=CAST('bad' AS BLOB)",
                  # A shape whose size overflows: get() must not try to allocate it.
                  "UPDATE objects SET dtype=0, shape='9223372036854775807,4', nbytes=0 "
                  "WHERE key=CAST('huge' AS BLOB)",
                  "DELETE FROM chunks WHERE key=CAST('huge' AS BLOB)")
    want = "object 'bad' chunks hold 24 bytes, expected 18446744073709551600"
    huge = "object 'huge' has shape fp32[9223372036854775807, 4] whose size overflows 64 bits"
    with strata.Store.open(store_path, **opts) as s:  # the open does not fail
        info = s.stat("bad")
        assert info.damage == want
        assert info.nbytes == 2**64 - 16  # what the row claims
        assert info.dtype == "int32" and info.shape == (6,)
        assert [(i.key, i.damage) for i in s.list()] == [("bad", want), ("good", ""),
                                                         ("huge", huge)]
        np.testing.assert_array_equal(s.get("good"), good)
        with pytest.raises(strata.DataLossError) as e:
            s.get("bad")
        assert e.value.message == f"store {store_path}: {want}"
        for read in (s.get, s.get_tensor, lambda k: s.get_into(k, np.zeros(6, np.float32)),
                     lambda k: s.get_into(k, np.zeros(6, np.float64))):
            with pytest.raises(strata.DataLossError) as e:
                read("huge")
            assert e.value.message == f"store {store_path}: {huge}"
        with pytest.raises(strata.DataLossError) as e:
            s.get_into("bad", np.zeros(6, np.int32))
        assert e.value.message == f"store {store_path}: {want}"
        s.delete("huge")
        s.put("bad", bad, overwrite=True)
        assert s.stat("bad").damage == ""
        np.testing.assert_array_equal(s.get("bad"), bad)
    assert strata.ObjectInfo("k", "fp32", (1,), 4, "nvme", True, False, False, 1).damage == ""


def test_put_repeated_makes_a_large_object_from_one_chunk(store):
    c = store.chunk_bytes // 4
    block = np.arange(c, dtype=np.float32)
    n = 3 * c + 5
    store.put_repeated("z", block, n)
    info = store.stat("z")
    assert info.dtype == "fp32" and info.shape == (n,) and info.nbytes == 4 * n
    np.testing.assert_array_equal(store.get("z"), np.concatenate([block] * 3 + [block[:5]]))
    with pytest.raises(strata.InvalidArgumentError, match="repeat_bytes"):
        store.put_repeated("bad", block[:-1], n)  # not a multiple of the chunk
    with pytest.raises(strata.AlreadyExistsError):
        store.put_repeated("z", block, n)
    bits = np.zeros(2 * c, dtype=np.uint16)
    store.put_repeated("b", bits, 7, dtype="bf16")
    assert store.stat("b").dtype == "bf16" and store.stat("b").shape == (7,)
