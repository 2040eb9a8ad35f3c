"""Blocking calls release the GIL: another Python thread keeps running during a long get."""
import threading
import time

import numpy as np


def _max_gap_while(fn):
    """Runs fn() on a thread while this thread records timestamps; returns (max gap between
    consecutive timestamps during fn, fn's duration)."""
    started = threading.Event()
    done = threading.Event()
    span = {}

    def worker():
        started.set()
        t0 = time.perf_counter()
        fn()
        span["t"] = (t0, time.perf_counter())
        done.set()

    th = threading.Thread(target=worker)
    stamps = []
    th.start()
    started.wait()
    while not done.is_set():
        stamps.append(time.perf_counter())
    th.join()
    t0, t1 = span["t"]
    inside = [s for s in stamps if t0 <= s <= t1] or [t0]
    pts = [t0] + inside + [t1]
    return max(b - a for a, b in zip(pts, pts[1:])), t1 - t0


def test_other_thread_runs_during_long_get(store):
    # 256 MiB from NVMe with checksum verification: hundreds of milliseconds here.
    a = np.ones(64 << 20, dtype=np.float32)
    store.put("big", a)
    del a
    gap, duration = _max_gap_while(lambda: store.get("big"))
    assert duration > 0.05, duration
    # With the GIL held for the whole get, the gap would be the whole duration (the bound
    # leaves room for the OS scheduler on a loaded 2-core machine).
    assert gap < duration / 3, (gap, duration)


def test_other_thread_runs_during_future_wait(store):
    a = np.ones(32 << 20, dtype=np.float32)
    store.put("big", a)
    out = np.empty_like(a)
    gap, duration = _max_gap_while(lambda: store.get_into_async("big", out).result())
    assert duration > 0.02, duration
    assert gap < duration / 3, (gap, duration)
    assert (out == 1).all()
