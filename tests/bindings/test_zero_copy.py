"""Arrays cross the boundary without copies when the dtype matches.

Evidence used: (1) get_into writes into the caller's memory (same address, new values);
(2) the process's peak resident memory (VmHWM, reset through /proc/self/clear_refs) grows by
far less than the 32 MiB array during put / get_into, whatever allocates (numpy, C++),
while the converting path (other dtype, cast=True) grows by at least the object's size;
(3) get() returns memory aligned to 4096 bytes that the store read into directly.
"""

import numpy as np
import pytest
import torch

N = 8 << 20  # 8 Mi float32 = 32 MiB


def _vm(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _peak_during(fn):
    """Growth of the peak RSS while fn() runs. fn runs once before, so one-time costs (the
    store's staging buffers, lazily faulted pages) do not count."""
    fn()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS: {e}")
    base = _vm("VmRSS")
    fn()
    return _vm("VmHWM") - base


def test_put_from_numpy_makes_no_copy(store):
    a = np.arange(N, dtype=np.float32)
    peak = _peak_during(lambda: store.put("a", a, tier="nvme", overwrite=True))
    assert peak < 4 << 20, peak  # far below the 32 MiB of the array


def test_get_into_numpy_same_dtype_is_in_place(store):
    a = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    store.put("a", a)
    out = np.zeros(N, dtype=np.float32)
    addr = out.ctypes.data
    peak = _peak_during(lambda: store.get_into("a", out))
    assert out.ctypes.data == addr
    np.testing.assert_array_equal(out, a)
    assert peak < 4 << 20, peak


def test_get_into_other_dtype_converts(store):
    a = np.arange(N, dtype=np.float32)
    store.put("a", a)
    out = np.zeros(N, dtype=np.float64)
    peak = _peak_during(lambda: store.get_into("a", out, cast=True))
    np.testing.assert_array_equal(out, a.astype(np.float64))
    assert peak >= N * 4 * 0.9  # a temporary of (about) the object's size was needed


def test_get_into_torch_tensor_in_place(store):
    t = torch.arange(N, dtype=torch.float32).reshape(1024, -1)
    store.put("t", t)
    out = torch.zeros(1024, N // 1024)
    ptr = out.data_ptr()
    peak = _peak_during(lambda: store.get_into("t", out))
    assert out.data_ptr() == ptr
    assert torch.equal(out, t)
    assert peak < 4 << 20, peak


def test_put_from_torch_tensor_makes_no_copy(store):
    t = torch.ones(N, dtype=torch.bfloat16)
    peak = _peak_during(lambda: store.put("t", t, overwrite=True))
    assert peak < 4 << 20, peak
    assert store.stat("t").dtype == "bf16"


def test_get_returns_aligned_array_shared_with_torch(store):
    store.put("a", np.arange(1000, dtype=np.int32))
    g = store.get("a")
    assert g.ctypes.data % 4096 == 0
    assert g.flags.writeable and g.flags.c_contiguous
    t = torch.from_numpy(g)
    assert t.data_ptr() == g.ctypes.data
    del g
    # the memory stays valid through the tensor after the array is gone
    assert t[999].item() == 999


def test_non_contiguous_is_rejected_not_copied(store):
    a = np.arange(100, dtype=np.float32)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        store.put("a", a)
    store.put("b", np.zeros((10, 10), dtype=np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        store.get_into("b", np.zeros((10, 20), dtype=np.float32)[:, ::2])
