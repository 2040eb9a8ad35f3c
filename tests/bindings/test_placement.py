"""NUMA placement seen from Python: the plan a store reports, and that binding its I/O
threads never widens the CPUs the process was allowed (taskset / cpusets)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import strata


def test_numa_node_values(store_path):
    with pytest.raises(strata.InvalidArgumentError) as e:
        strata.Store.open(store_path, numa_node=-3)
    assert "StoreOptions.numa_node=-3: expected a node number, -1 (automatic) or -2 (none)" \
        in str(e.value)
    assert not os.path.exists(store_path) or os.listdir(store_path) == []
    with strata.Store.open(store_path, numa_node=-2) as s:
        s.put("x", np.arange(10))
        assert s.get("x").tolist() == list(range(10))


def test_io_threads_stay_within_the_process_affinity(tmp_path):
    # A child restricted to one CPU opens a store (automatic placement binds the I/O
    # threads to the directory's node); every thread, io-wq workers included, keeps that
    # one CPU.
    cpu = min(os.sched_getaffinity(0))
    code = textwrap.dedent(f"""
        import os
        os.sched_setaffinity(0, {{{cpu}}})  # first: numpy's OpenBLAS threads start at import
        import numpy as np, strata
        s = strata.Store.open({str(tmp_path / 's')!r}, staging="4MiB")
        s.put("x", np.arange(100000))
        assert s.get("x")[-1] == 99999
        cpus = set()
        for t in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{{t}}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        cpus.add(line.split()[1])
        s.close()
        print(sorted(cpus))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str([str(cpu)])


def test_calls_racing_close_fail_cleanly(tmp_path):
    # Was: a get in another thread while close() succeeded crashed the interpreter (the
    # store was freed under it), or raised NotFoundError for keys that exist.
    import threading
    from collections import Counter
    seen = Counter()
    errors = []
    for it in range(10):
        s = strata.Store.open(str(tmp_path / f"s{it}"), chunk_size=1 << 20, staging=64 << 10,
                              host_budget=64 << 20)
        for i in range(20):
            s.put(f"k{i}", np.full(1 << 18, i, np.uint8), "host")
        stop = threading.Event()
        reading = threading.Event()

        def reader():
            try:
                read()
            except BaseException as e:  # reported below (pytest would only warn)
                errors.append(e)
                reading.set()

        def read():
            while not stop.is_set():
                for i in range(20):
                    try:
                        assert s.get(f"k{i}")[0] == i
                        s.keys()  # racing close: the keys, or none once it is closing
                        s.usage()
                        seen["ok"] += 1
                        reading.set()
                    except strata.FailedPreconditionError:
                        seen["closed"] += 1
        t = threading.Thread(target=reader)
        t.start()
        reading.wait(30)
        s.close()
        stop.set()
        t.join()
        assert errors == []
        assert s.closed
        for f in (lambda: s.stat("k0"), s.keys, s.usage, lambda: s.get("k0")):
            with pytest.raises(strata.FailedPreconditionError):
                f()
    assert seen["ok"] > 0 and set(seen) <= {"ok", "closed"}
