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
        import os, numpy as np, strata
        os.sched_setaffinity(0, {{{cpu}}})
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
