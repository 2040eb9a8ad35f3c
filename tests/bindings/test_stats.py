"""Counters from Python: Store.stats() / reset_stats(), the optimizers' stats(), the periodic
log (STRATA_STATS_INTERVAL) and `strata store stat --verify`."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import strata
import strata.torch as st

MIB = 1 << 20


def test_store_counters_after_put_get_prefetch_evict(store):  # 1 MiB chunks, 64 MiB host
    a = np.arange(3 * MIB // 4, dtype=np.int32)  # 3 MiB: 3 chunks
    store.put("a", a)
    s = store.stats()
    assert s["nvme_write_ops"] == 3 and s["nvme_write_bytes"] == 3 * MIB
    assert s["nvme_read_ops"] == 0 and s["host_write_ops"] == 0
    assert isinstance(s["nvme_write_wait_seconds"], float) and s["nvme_write_wait_seconds"] > 0
    np.testing.assert_array_equal(store.get("a"), a)
    s = store.stats()
    assert s["nvme_read_ops"] == 3 and s["nvme_read_bytes"] == 3 * MIB
    assert s["prefetch_misses"] == 1 and s["prefetch_hits"] == 0
    store.reset_stats()
    store.prefetch("a", "host")
    store.get("a")
    s = store.stats()
    assert (s["prefetches"], s["prefetch_hits"], s["prefetch_misses"]) == (1, 1, 0)
    assert (s["promotions"], s["promotion_bytes"]) == (1, 3 * MIB)
    assert (s["host_read_ops"], s["host_read_bytes"]) == (1, 3 * MIB)
    assert s["host_pool_in_use_bytes"] == 3 * MIB and s["host_pool_capacity_bytes"] == 64 * MIB
    store.evict("a")
    s = store.stats()
    assert (s["evictions"], s["eviction_bytes"], s["writebacks"]) == (1, 3 * MIB, 0)
    assert s["host_pool_in_use_bytes"] == 0 and s["host_pool_peak_bytes"] == 3 * MIB
    assert s["checksum_failures"] == 0
    names = set(s)
    assert {"device_read_bytes", "staging_pool_peak_bytes", "lru_evictions",
            "nvme_read_wait_seconds", "elapsed_seconds"} <= names and len(names) == 34


def test_corrupted_chunk_counts_one_checksum_failure(store_path):
    s = strata.Store.open(store_path, chunk_size="1MiB", staging="4MiB", host_budget="8MiB")
    s.put("c", np.arange(2048, dtype=np.int32))
    s.close()
    data = [f for f in os.listdir(store_path) if f.endswith(".data")]
    with open(os.path.join(store_path, data[0]), "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 1]))
    s = strata.Store.open(store_path, staging="4MiB", host_budget="8MiB")
    with pytest.raises(strata.DataLossError):
        s.get("c")
    assert s.stats()["checksum_failures"] == 1
    s.close()


def test_offloaded_optimizer_stats(tmp_path):
    m = torch.nn.Linear(100, 30)  # 3030 parameters
    opt = st.OffloadAdamW(m.parameters(), path=str(tmp_path / "s"), tier="nvme", num_threads=1,
                          sub_group_numel=1000)
    assert opt.stats()["steps"] == 0
    for _ in range(2):
        m(torch.randn(4, 100)).sum().backward()
        opt.step()
        opt.zero_grad()
    s = opt.stats()
    numel = sum(p.numel() for p in m.parameters())
    assert s["steps"] == 2 and s["steps_skipped"] == 0
    assert s["bytes_read"] == 2 * numel * 4 * 3 and s["bytes_written"] == s["bytes_read"]
    assert s["numel_updated"] == 2 * numel
    assert s["sub_groups"] >= 2 * 4  # 3000 + 30 elements in sub-groups of at most 1000
    assert s["sub_groups"] == 2 * opt.last_step["sub_groups"]
    assert s["update_seconds"] > 0 and 0 < s["overlap"] <= 1
    assert s["step_seconds"] >= s["update_seconds"]
    # The store beneath counted the same pipeline I/O (and more: the parameters' puts).
    assert opt.store.stats()["nvme_read_bytes"] >= s["bytes_read"]
    opt.reset_stats()
    assert opt.stats()["steps"] == 0
    opt.close()


SNIPPET = """
import numpy as np, strata, sys, time
s = strata.Store.open(sys.argv[1], chunk_size="1MiB", staging="4MiB", host_budget="8MiB")
s.put("k", np.zeros(1 << 18, dtype=np.float32))
time.sleep(0.3)
s.close()
"""


def _run(env_value, path):
    env = dict(os.environ)
    env.pop("STRATA_STATS_INTERVAL", None)
    if env_value is not None:
        env["STRATA_STATS_INTERVAL"] = env_value
    return subprocess.run([sys.executable, "-c", SNIPPET, path], env=env, capture_output=True,
                          text=True, timeout=120)


def test_periodic_log_lines(tmp_path):
    p = _run("0.05", str(tmp_path / "on"))
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("strata [stats] ")]
    assert len(lines) >= 2, p.stderr
    pat = re.compile(r"strata \[stats\] " + re.escape(str(tmp_path / "on")) +
                     r" interval=0\.\d\ds( [a-z_]+=\d+(\.\d{3})?)*")
    assert all(pat.fullmatch(ln) for ln in lines), lines
    # the lines are deltas: the put's one chunk write appears once, in whichever line covers
    # it (anywhere in the line, the last field included)
    writes = [int(m) for ln in lines for m in re.findall(r" nvme_write_ops=(\d+)(?= |$)", ln)]
    assert sum(writes) == 1, lines

    p = _run(None, str(tmp_path / "off"))
    assert p.returncode == 0 and "strata [stats]" not in p.stderr, p.stderr

    p = _run("soon", str(tmp_path / "bad"))
    assert p.returncode != 0
    assert "STRATA_STATS_INTERVAL='soon'" in p.stderr, p.stderr


def test_cli_store_stat_verify(store, store_path):
    cli = os.environ.get("STRATA_CLI")
    if not cli:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    store.put("x", np.ones(MIB // 2, dtype=np.float32))  # 2 MiB
    store.put("y", np.ones(1000, dtype=np.uint8))
    store.close()
    path = store_path
    j = json.loads(subprocess.run([cli, "store", "stat", path, "--json"], check=True,
                                  capture_output=True, text=True).stdout)
    assert (j["objects"], j["object_bytes"], j["damaged"]) == (2, 2 * MIB + 1000, 0)
    assert j["nvme_bytes"] == 2 * MIB + 4096 and j["chunk_bytes"] == MIB
    assert "stats" not in j
    j = json.loads(subprocess.run([cli, "store", "stat", path, "--json", "--verify"],
                                  check=True, capture_output=True, text=True).stdout)
    assert j["verify"]["chunks"] == 3 and j["verify"]["errors"] == 0
    assert j["stats"]["nvme_read_ops"] == 3
    assert j["stats"]["nvme_read_bytes"] == 2 * MIB + 4096
    assert j["stats"]["checksum_failures"] == 0
    text = subprocess.run([cli, "store", "stat", path, "--verify"], check=True,
                          capture_output=True, text=True).stdout
    assert "objects: 2, " in text and "verify: 3 chunks" in text
    assert re.search(r"^  nvme_read_ops +3$", text, re.M), text
    # `store verify` draws a progress line from the counters when asked (STRATA_PROGRESS=1
    # into a pipe; a terminal would draw it unasked), and none when piped.
    env = dict(os.environ, STRATA_PROGRESS="1")
    p = subprocess.run([cli, "store", "verify", path], env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert re.search(rb"\rverify: [0-9.]+ [KMG]?i?B / 2\.00 MiB", p.stderr), p.stderr
    env["STRATA_PROGRESS"] = "0"
    p = subprocess.run([cli, "store", "verify", path], env=env, capture_output=True)
    assert p.returncode == 0 and b"\r" not in p.stderr, p.stderr


def test_cli_verify_progress_counts_the_disk_bytes(store, store_path):
    # 40 objects of 100 bytes: the disk reads one 4 KiB block for each (160 KiB), so the
    # progress line's total is 160 KiB, not the 3.91 KiB of the objects (which it would
    # reach a tenth of the way through, then show 100% until the end).
    cli = os.environ.get("STRATA_CLI")
    if not cli:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    for i in range(40):
        store.put(f"small{i}", np.full(100, i, dtype=np.uint8))
    store.close()
    env = dict(os.environ, STRATA_PROGRESS="1")
    p = subprocess.run([cli, "store", "verify", store_path], env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    totals = set(re.findall(rb"\rverify: [0-9.]+ [KMG]?i?B / ([0-9.]+ [KMG]?i?B)", p.stderr))
    assert totals == {b"160.00 KiB"}, p.stderr



def test_periodic_log_counts_a_put_right_after_open(tmp_path):
    # The first line's baseline is taken in open(), not when the logging thread first runs
    # (then a put right after the open of a fresh process often lost its bytes and ops from
    # every line, while its wait time, counted at completion, still showed). Fresh processes,
    # since a warm one starts the thread in time.
    env = dict(os.environ, STRATA_STATS_INTERVAL="0.05")
    procs = [subprocess.Popen([sys.executable, "-c", SNIPPET, str(tmp_path / f"s{i}")], env=env,
                              stderr=subprocess.PIPE, text=True) for i in range(8)]
    for p in procs:
        err = p.communicate(timeout=120)[1]
        assert p.returncode == 0, err
        assert sum(" nvme_write_ops=1 " in ln for ln in err.splitlines()) == 1, err


def test_periodic_log_last_line_at_close_and_sub_millisecond_refused(tmp_path):
    # A run shorter than the interval logs its counters at close() (before: nothing at all).
    p = _run("10", str(tmp_path / "long"))
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("strata [stats] ")]
    assert len(lines) == 1 and " nvme_write_ops=1 " in lines[0], p.stderr
    # A positive interval under 1 ms would round to 0 (off): refused by name.
    p = _run("1e-9", str(tmp_path / "tiny"))
    assert p.returncode != 0 and "STRATA_STATS_INTERVAL='1e-9'" in p.stderr, p.stderr
