"""strata errors map to Python's built-in exceptions and all subclass strata.Error."""
import errno
import os

import numpy as np
import pytest

import strata


def test_missing_key_is_key_error(store):
    with pytest.raises(KeyError) as e:
        store.get("nope")
    assert isinstance(e.value, strata.Error)
    assert isinstance(e.value, strata.NotFoundError)
    assert e.value.code == "NotFound"
    assert "'nope'" in str(e.value)
    for call in (lambda: store.stat("nope"), lambda: store.delete("nope"),
                 lambda: store.move("nope", "host"), lambda: store.get_async("nope")):
        with pytest.raises(KeyError):
            call()


def test_existing_key_is_key_error(store):
    store.put("k", np.zeros(3))
    with pytest.raises(KeyError) as e:
        store.put("k", np.zeros(3))
    assert isinstance(e.value, strata.AlreadyExistsError)


def test_bad_dtype_shape_size_are_value_errors(store):
    with pytest.raises(ValueError) as e:
        store.put("c", np.zeros(4, dtype=np.complex64))
    assert isinstance(e.value, strata.InvalidArgumentError)
    store.put("f", np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError) as e:  # shape mismatch
        store.get_into("f", np.zeros((3, 2), dtype=np.float32))
    assert isinstance(e.value, strata.Error)
    with pytest.raises(ValueError):  # size mismatch on the converting path
        store.get_into("f", np.zeros(7, dtype=np.float64), cast=True)
    with pytest.raises(ValueError):  # read-only destination
        ro = np.zeros((2, 3), dtype=np.float32)
        ro.setflags(write=False)
        store.get_into("f", ro)
    with pytest.raises(ValueError):  # dtype override of another size
        store.put("g", np.zeros(4, dtype=np.float32), dtype="bf16")
    with pytest.raises(ValueError):
        store.put("g", np.zeros(4), tier="tape")
    with pytest.raises(ValueError) as e:  # past the end
        store.read_range("f", 20, 8)
    assert isinstance(e.value, strata.OutOfRangeError)
    with pytest.raises(ValueError):
        strata.parse_size("12 parsecs")


def test_budget_is_memory_error(tmp_path):
    with strata.Store.open(str(tmp_path / "s"), host_budget="1MiB", staging="4MiB",
                           chunk_size="1MiB") as s:
        with pytest.raises(MemoryError) as e:
            s.put("big", np.zeros(1 << 20, dtype=np.float32), tier="host")  # 4 MiB > 1 MiB
        assert isinstance(e.value, strata.ResourceExhaustedError)
        assert isinstance(e.value, strata.Error)


def test_io_failure_is_os_error_with_errno(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError) as e:
        strata.Store.open(str(not_a_dir / "store"))
    assert isinstance(e.value, strata.Error)
    assert e.value.errno == errno.ENOTDIR
    assert "file" in str(e.value)


def test_closed_store_is_strata_error_only(store):
    store.close()
    with pytest.raises(strata.FailedPreconditionError) as e:
        store.get("x")
    assert not isinstance(e.value, (KeyError, ValueError, OSError, MemoryError))


def test_future_timeout_is_timeout_error(store):
    store.put("big", np.ones(32 << 20, dtype=np.float32))
    f = store.get_async("big")
    try:
        f.result(timeout=0.0)
    except TimeoutError as e:  # the usual outcome: a 128 MiB read is not done at once
        assert isinstance(e, strata.DeadlineExceededError)
    assert f.result().shape == (32 << 20,)


@pytest.fixture
def tiny_tmpfs(mount_tmpfs):
    """A 2 MiB tmpfs (skips where mount is refused)."""
    return str(mount_tmpfs("2m"))


def test_full_disk_is_os_error_with_enospc(tmp_path, tiny_tmpfs):
    s = strata.Store.open(str(tmp_path / "root"), nvme=[tiny_tmpfs], chunk_size="1MiB",
                          staging="4MiB", workers=2)
    try:
        with pytest.raises(OSError) as e:  # as any disk-full error is caught
            s.put("big", np.zeros(3 << 20, dtype=np.uint8))
        err = e.value
        assert err.errno == errno.ENOSPC
        assert isinstance(err, strata.Error)
        assert isinstance(err, strata.DiskFullError)
        assert isinstance(err, strata.ResourceExhaustedError)  # as before: also MemoryError
        assert err.code == "ResourceExhausted"
        assert tiny_tmpfs in err.message
        assert f"[errno {errno.ENOSPC}]" in str(err)
        assert "big" not in s
        # the store stays usable and the failed put's space is free again
        s.put("small", np.arange(1 << 18, dtype=np.uint8))
        assert np.array_equal(s.get("small"), np.arange(1 << 18, dtype=np.uint8))
    finally:
        s.close()


def test_up_front_disk_space_check_is_disk_full(tmp_path, mount_tmpfs):
    """The offloaded optimizer's disk-space check before writing (create, add_param,
    check_disk_space) raises the type a full disk raises during a write: DiskFullError,
    errno ENOSPC, so ``except OSError`` catches both."""
    fs = str(mount_tmpfs("20m"))
    with strata.Store.open(fs + "/s", staging="4MiB", chunk_size="1MiB", workers=2) as s:
        o = strata.OffloadedOptimizer.create(s, "adamw", default_placement="nvme")
        try:
            for call, where in ((lambda: o.check_disk_space([1 << 20]), "offload: "),
                                (lambda: o.add_param("w", 1 << 20), "offload add_param 'w': ")):
                with pytest.raises(OSError) as e:
                    call()
                err = e.value
                assert isinstance(err, strata.DiskFullError), repr(err)
                assert isinstance(err, strata.ResourceExhaustedError)
                assert err.errno == errno.ENOSPC and err.code == "ResourceExhausted"
                assert err.message.startswith(where + "not enough disk space"), err.message
                assert fs + "/s" in err.message
            assert o.num_params() == 0  # nothing added
            assert o.add_param("small", 1000) == 0  # what fits still goes in
        finally:
            o.close(checkpoint=False)
        # create's own check: the file system nearly full (under the 1 MiB catalog margin)
        filler = os.path.join(fs, "filler")
        with open(filler, "wb") as f:
            free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
            f.write(b"\0" * max(0, free - (256 << 10)))
        with pytest.raises(OSError) as e:
            strata.OffloadedOptimizer.create(s, "adamw", key_prefix="b/",
                                             default_placement="nvme")
        assert isinstance(e.value, strata.DiskFullError) and e.value.errno == errno.ENOSPC
        assert e.value.message.startswith("offload create: not enough disk space"), e.value
        os.remove(filler)


def test_full_budget_is_not_an_os_error(tmp_path):
    s = strata.Store.open(str(tmp_path / "root"), host_budget="1MiB", staging="4MiB",
                          chunk_size="1MiB", workers=2)
    try:
        s.put("a", np.zeros(1 << 20, dtype=np.uint8), tier="host")
        s.pin("a")
        with pytest.raises(strata.ResourceExhaustedError) as e:
            s.put("b", np.zeros(1 << 20, dtype=np.uint8), tier="host")
        assert isinstance(e.value, MemoryError)
        assert not isinstance(e.value, OSError)
        assert e.value.errno == 0
    finally:
        s.close()
