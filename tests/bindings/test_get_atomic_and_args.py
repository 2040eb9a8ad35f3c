"""Defects of issue 3 found by a new user: gets racing overwrites, get_into converting dtypes
silently, and argument errors outside the strata.Error family."""
import threading

import numpy as np
import pytest
import torch

import strata


# ---- get / get_async / get_tensor are atomic under concurrent overwrites -----------------

@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_get_returns_one_whole_version_while_overwritten(store, tier):
    # Version i is np.full(10 + i % 2, i): its length follows from its value, so a torn
    # read (one version's desc, another's bytes, or a mismatch error) cannot pass.
    store.put("k", np.full(10, 0, dtype=np.int32), tier=tier)
    stop = threading.Event()
    puts = [0]
    errors = []

    def writer():
        i = 1
        try:
            while not stop.is_set():
                store.put("k", np.full(10 + i % 2, i, dtype=np.int32), tier=tier,
                          overwrite=True)
                first_put.set()
                i += 1
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        puts[0] = i - 1
        first_put.set()

    first_put = threading.Event()
    t = threading.Thread(target=writer)
    t.start()
    first_put.wait(60)  # the reads race overwrites from the first one on
    lengths = {10: 0, 11: 0}
    try:
        for j in range(2000):
            if j % 3 == 0:
                a = store.get("k")
            elif j % 3 == 1:
                a = store.get_async("k").result()
            else:
                a = store.get_tensor("k").numpy()
            assert a.dtype == np.int32
            v = int(a[0])
            assert a.shape == (10 + v % 2,), (j, a)
            assert a.tolist() == [v] * (10 + v % 2), (j, a)
            lengths[a.shape[0]] += 1
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert puts[0] > 0
    assert lengths[10] + lengths[11] == 2000
    last = store.get("k")
    assert last.tolist() == [puts[0]] * (10 + puts[0] % 2)


def test_get_of_a_key_deleted_meanwhile_is_not_found(store):
    store.put("gone", np.arange(3, dtype=np.int64))
    f = store.get_async("gone")
    assert f.result().tolist() == [0, 1, 2]
    store.delete("gone")
    with pytest.raises(strata.NotFoundError):
        store.get_async("gone")
    with pytest.raises(strata.NotFoundError):
        store.get("gone")


# ---- get_into: a dtype mismatch is an error unless cast=True -----------------------------

def test_get_into_other_dtype_is_refused_without_cast(store):
    store.put("f", np.array([1.5, -2.7, 3.9], dtype=np.float32))
    out = np.full(3, 7, dtype=np.int32)
    with pytest.raises(strata.InvalidArgumentError) as e:
        store.get_into("f", out)
    assert isinstance(e.value, ValueError)
    assert e.value.message == ("get_into 'f': the object is fp32, the destination is int32 "
                               "(pass cast=True to convert)")
    assert out.tolist() == [7, 7, 7]  # untouched
    assert store.get_into("f", out, cast=True) is out
    assert out.tolist() == [1, -2, 3]  # truncation, as asked
    t = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(strata.InvalidArgumentError) as e:
        store.get_into("f", t)
    assert e.value.message == ("get_into 'f': the object is fp32, the destination is int32 "
                               "(pass cast=True to convert)")
    assert t.tolist() == [0, 0, 0]
    assert store.get_into("f", t, cast=True).tolist() == [1, -2, 3]
    d = np.zeros(3, dtype=np.float64)
    with pytest.raises(strata.InvalidArgumentError) as e:  # widening too: explicit only
        store.get_into("f", d)
    assert e.value.message == ("get_into 'f': the object is fp32, the destination is fp64 "
                               "(pass cast=True to convert)")
    store.get_into("f", d, cast=True)
    assert d.tolist() == [1.5, np.float32(-2.7).item(), np.float32(3.9).item()]
    with pytest.raises(strata.InvalidArgumentError) as e:
        store.get_into_async("f", np.zeros(3, dtype=np.int32))
    assert e.value.message == ("get_into_async 'f': the object is fp32, the destination is "
                               "int32 (use get_into(..., cast=True) to convert)")
    with pytest.raises(strata.InvalidArgumentError) as e:  # cast keeps the shape check
        store.get_into("f", np.zeros(4, dtype=np.int32), cast=True)
    assert e.value.message == "get_into 'f': the object has shape (3,), the destination (4,)"
    # Same dtype, and bf16 bits into 16-bit numpy arrays, need no cast.
    same = np.zeros(3, dtype=np.float32)
    assert store.get_into("f", same).tolist() == [1.5, np.float32(-2.7).item(),
                                                  np.float32(3.9).item()]
    store.put("b", torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    bits = np.zeros(2, dtype=np.uint16)
    store.get_into("b", bits)
    assert bits.tolist() == [0x3F80, 0xC000]
    f32 = np.zeros(2, dtype=np.float32)
    with pytest.raises(strata.InvalidArgumentError) as e:
        store.get_into("b", f32)
    assert e.value.message == ("get_into 'b': the object is bf16, the destination is fp32 "
                               "(pass cast=True to convert)")
    assert store.get_into("b", f32, cast=True).tolist() == [1.0, -2.0]


# ---- bad offsets / sizes / keys are strata InvalidArgument errors naming the argument ----

SURR = "a\udc80"
SURR_MSG = "key 'a\\udc80' is not valid UTF-8 text: lone surrogate U+DC80 at index 1"


def _invalid(call, message):
    with pytest.raises(strata.InvalidArgumentError) as e:
        call()
    assert isinstance(e.value, ValueError)
    assert e.value.message == message
    return e.value


def test_bad_offsets_and_sizes_are_invalid_argument(store):
    store.put("r", np.arange(16, dtype=np.uint8))
    _invalid(lambda: store.read_range("r", -1, 4), "offset must be >= 0, got -1")
    _invalid(lambda: store.read_range("r", 0, -4), "nbytes must be >= 0, got -4")
    _invalid(lambda: store.read_range("r", 1.5, 4), "offset must be an int, got float 1.5")
    _invalid(lambda: store.read_range("r", None, 4), "offset must be an int, got NoneType None")
    _invalid(lambda: store.read_range("r", True, 4), "offset must be an int, got bool True")
    _invalid(lambda: store.read_range("r", 2**64, 4),
             "offset = 18446744073709551616 does not fit in 64 bits (max 2**64-1)")
    _invalid(lambda: store.write_range("r", -3, np.zeros(2, np.uint8)),
             "offset must be >= 0, got -3")
    assert store.read_range("r", np.int64(4), np.uint32(3)).tolist() == [4, 5, 6]
    with pytest.raises(strata.OutOfRangeError):  # in range of uint64, past the end
        store.read_range("r", 2**64 - 1, 1)
    # Past the end, and more than could be allocated: OutOfRange, not a failed allocation.
    with pytest.raises(strata.OutOfRangeError) as e:
        store.read_range("r", 0, 2**62)
    assert str(e.value) == ("OutOfRange: read_range 'r': 4611686018427387904 bytes at offset 0 "
                            "go past the end of the object (16 bytes)")
    assert store.get("r").tolist() == list(range(16))  # still usable


def test_keys_without_utf8_encoding_are_invalid_argument(store):
    a = np.arange(3, dtype=np.int32)
    calls = [
        lambda: store.put(SURR, a), lambda: store.put_async(SURR, a),
        lambda: store.get(SURR), lambda: store.get_async(SURR), lambda: store.get_tensor(SURR),
        lambda: store.get_into(SURR, np.zeros(3, np.int32)),
        lambda: store.get_into_async(SURR, np.zeros(3, np.int32)),
        lambda: store.read_range(SURR, 0, 1), lambda: store.write_range(SURR, 0, a),
        lambda: store.stat(SURR), lambda: SURR in store, lambda: store.delete(SURR),
        lambda: store.delete_async(SURR), lambda: store.move(SURR, "host"),
        lambda: store.move_async(SURR, "host"), lambda: store.prefetch(SURR),
        lambda: store.prefetch_async(SURR), lambda: store.evict(SURR),
        lambda: store.pin(SURR), lambda: store.unpin(SURR),
    ]
    for call in calls:
        _invalid(call, SURR_MSG)
    _invalid(lambda: store.get(5), "key must be a str, got int 5")
    _invalid(lambda: store.get(b"k"), "key must be a str, got bytes b'k'")
    _invalid(lambda: store.keys(SURR),
             "prefix 'a\\udc80' is not valid UTF-8 text: lone surrogate U+DC80 at index 1")
    _invalid(lambda: store.list("x\ud800y"),
             "prefix 'x\\ud800y' is not valid UTF-8 text: lone surrogate U+D800 at index 1")
    _invalid(lambda: store.put("k", a, tier="n\udc80"),
             "tier 'n\\udc80' is not valid UTF-8 text: lone surrogate U+DC80 at index 1")
    _invalid(lambda: store.put("k", a, dtype=3), "dtype must be a str, got int 3")
    # Valid non-ASCII keys still work, and nothing was stored by the refused calls.
    store.put("ключ/ü 1", a)
    assert store.keys() == ["ключ/ü 1"]
    assert store.get("ключ/ü 1").tolist() == [0, 1, 2]


def test_optimizer_bad_counts_and_names_are_invalid_argument(store):
    o = strata.OffloadedOptimizer.create(store, "adamw", {"lr": 0.1})
    _invalid(lambda: o.add_param("w", -1), "numel must be >= 0, got -1")
    _invalid(lambda: o.add_param(SURR, 4),
             "name 'a\\udc80' is not valid UTF-8 text: lone surrogate U+DC80 at index 1")
    h = o.add_param("w", 4, np.arange(4, dtype=np.float32))
    _invalid(lambda: o.read_param(h, offset=-1), "offset must be >= 0, got -1")
    _invalid(lambda: o.read_param(h, count=-2), "count must be >= 0, got -2")
    _invalid(lambda: o.write_param(h, np.zeros(1, np.float32), -1),
             "offset must be >= 0, got -1")
    _invalid(lambda: o.read_state(h, 0, offset=-1), "offset must be >= 0, got -1")
    _invalid(lambda: o.write_state(h, 0, np.zeros(1, np.float32), -5),
             "offset must be >= 0, got -5")
    assert o.read_param(h, offset=1, count=2).tolist() == [1.0, 2.0]
    o.close()
    _invalid(lambda: strata.OffloadedOptimizer.create(store, "adamw", key_prefix=SURR),
             "key_prefix 'a\\udc80' is not valid UTF-8 text: lone surrogate U+DC80 at index 1")
    _invalid(lambda: strata.OffloadedOptimizer.create(store, "adamw", key_prefix="o2/",
                                                      sub_group_numel=-1),
             "sub_group_numel must be >= 0, got -1")


def test_open_paths_are_str_or_pathlike(tmp_path):
    _invalid(lambda: strata.Store.open(5), "path must be a str or os.PathLike, got int 5")
    with strata.Store.open(tmp_path / "p", host_budget="16MiB", staging="4MiB",
                           chunk_size="1MiB", workers=1) as s:  # a pathlib.Path
        s.put("x", np.ones(2, np.float32))
        assert s.get("x").tolist() == [1.0, 1.0]
