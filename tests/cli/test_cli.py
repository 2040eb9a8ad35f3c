"""End-to-end tests of the `strata` tool: each command runs for real on small sizes and its
JSON output is checked field by field."""
import json
import re
import os
import subprocess

import pytest

STRATA = os.environ.get("STRATA_CLI", "strata")


def run(*args, check=True, timeout=300):
    p = subprocess.run([STRATA, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


def run_json(*args, **kw):
    p = run(*args, "--json", **kw)
    out = p.stdout.strip()
    try:
        return json.loads(out)
    except json.JSONDecodeError:  # progress lines before a one-line JSON object
        return json.loads(out.splitlines()[-1])


def run_json_rusage(*args):
    """run_json(*args), and the run's own resource usage (os.wait4: its peak RSS, ...)."""
    import tempfile
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([STRATA, *map(str, args), "--json"], stdout=subprocess.PIPE,
                                stderr=err)
        out = proc.stdout.read().decode()
        proc.stdout.close()
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        assert proc.returncode == 0, err.read().decode()
    return json.loads(out.strip().splitlines()[-1]), rusage


def error_match(p, pattern):
    """The match of `pattern` with the whole of p's stderr, asserting that p exited 1 and
    that it matches."""
    m = re.fullmatch(pattern, p.stderr)
    assert p.returncode == 1 and m, p.stderr
    return m


@pytest.fixture
def disk_dir():
    # /var/tmp is on the real disk (O_DIRECT works); /tmp may be too.
    import tempfile
    d = tempfile.mkdtemp(prefix="strata-cli-", dir="/var/tmp")
    yield d
    subprocess.run(["rm", "-rf", d])


@pytest.mark.parametrize("engine", ["uring", "threads"])
def test_bench_io_write_then_read(disk_dir, engine):
    w = run_json("bench", "io", "--path", disk_dir, "--size", "8MiB", "--block-size", "1MiB",
                 "--queue-depth", "4", "--op", "write", "--engine", engine, "--keep")
    assert w["op"] == "write"
    assert w["bytes"] == 8 * 1024 * 1024
    assert w["block_size"] == 1024 * 1024
    assert w["queue_depth"] == 4
    assert w["engine"] == engine
    assert w["direct"] is True
    assert w["seconds"] > 0
    assert w["gbps"] == pytest.approx(w["bytes"] / w["seconds"] / 1e9, rel=1e-9)
    r = run_json("bench", "io", "--path", disk_dir, "--size", "8MiB", "--block-size", "1MiB",
                 "--queue-depth", "4", "--op", "read", "--engine", engine)
    assert r["op"] == "read"
    assert r["bytes"] == 8 * 1024 * 1024
    # the read did not create the file (the write kept it): it stays
    assert os.path.getsize(os.path.join(disk_dir, "strata-bench-io.dat")) == 8 * 1024 * 1024


def test_bench_io_striped_over_two_dirs(disk_dir):
    a, b = os.path.join(disk_dir, "a"), os.path.join(disk_dir, "b")
    os.mkdir(a)
    os.mkdir(b)
    r = run_json("bench", "io", "--path", a, "--path", b, "--size", "4MiB", "--block-size",
                 "256KiB", "--queue-depth", "8", "--op", "read")
    assert r["bytes"] == 4 * 1024 * 1024
    # the read laid the files out itself: removed at its end
    assert os.listdir(a) == [] and os.listdir(b) == []
    r = run_json("bench", "io", "--path", a, "--path", b, "--size", "4MiB", "--block-size",
                 "256KiB", "--queue-depth", "8", "--op", "read", "--keep")
    assert os.path.getsize(os.path.join(a, "strata-bench-io.dat")) == 2 * 1024 * 1024
    assert os.path.getsize(os.path.join(b, "strata-bench-io.dat")) == 2 * 1024 * 1024


def test_bench_io_removes_the_file_it_created_on_success(disk_dir):
    for op in ("write", "read"):
        run_json("bench", "io", "--path", disk_dir, "--size", "4MiB", "--block-size", "1MiB",
                 "--op", op)
        assert os.listdir(disk_dir) == [], op


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_bench_io_removes_its_file_when_interrupted(disk_dir, sig):
    import signal
    import time
    # buffered writes of 1 GiB in 4 KiB requests at queue depth 1: long enough to interrupt
    p = subprocess.Popen([STRATA, "bench", "io", "--path", disk_dir, "--size", "1GiB",
                          "--block-size", "4KiB", "--queue-depth", "1", "--op", "write",
                          "--buffered", "--engine", "threads"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    f = os.path.join(disk_dir, "strata-bench-io.dat")
    deadline = time.monotonic() + 30
    while not (os.path.exists(f) and os.path.getsize(f) > 0) and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        time.sleep(0.01)
    assert os.path.exists(f)
    p.send_signal(getattr(signal, sig))
    p.communicate(timeout=60)
    assert p.returncode == -getattr(signal, sig)  # ended by the signal, as before
    assert os.listdir(disk_dir) == []


@pytest.mark.parametrize("args, message", [
    (["bench", "io", "--pth", "{d}", "--op", "write"],
     r"strata bench io: unknown option '--pth' \(did you mean '--path'\?\)"),
    (["bench", "io", "--path", "{d}", "--size", "1MiB", "--jsn"],
     r"strata bench io: unknown option '--jsn' \(did you mean '--json'\?\)"),
    (["bench", "iox"],
     r"strata bench: unknown argument 'iox' \(did you mean 'io'\?\)"),
    (["store", "ls", "{d}", "--prefx", "a"],
     r"strata store ls: unknown option '--prefx' \(did you mean '--prefix'\?\)"),
    (["info", "--path", "{d}", "--zzz"], r"strata info: unknown option '--zzz'"),
    (["launch", "-n", "1", "--master-prot", "1", "--", "true"],
     r"strata launch: unknown option '--master-prot' \(did you mean '--master-port'\?\)"),
    (["bench", "store", "--path", "{d}", "--countt", "1", "--roundz", "1"],
     r"strata bench store: unknown option '--countt' \(did you mean '--count'\?\), "
     r"option '--roundz' \(did you mean '--rounds'\?\)"),
])
def test_unknown_options_are_named(disk_dir, args, message):
    p = run(*[a.format(d=disk_dir) for a in args], check=False)
    command = re.match(r"strata [a-z ]+?(?=:)", message.replace("\\", "")).group(0)
    error_match(p, rf"strata: error: InvalidArgument: {message}; see '{command} --help'\n")
    assert os.listdir(disk_dir) == []


def test_bench_io_bad_input_names_the_problem(disk_dir):
    p = run("bench", "io", "--path", os.path.join(disk_dir, "missing"), "--size", "1MiB",
            "--op", "write", check=False)
    assert p.returncode != 0
    assert "missing" in p.stderr
    p = run("bench", "io", "--path", disk_dir, "--size", "12 parsecs", "--op", "write", check=False)
    assert p.returncode != 0
    assert "12 parsecs" in p.stderr
    p = run("bench", "io", "--path", disk_dir, "--size", "1MiB", "--op", "append", check=False)
    assert p.returncode != 0
    assert "append" in p.stderr


def test_info_json(disk_dir):
    info = run_json("info", "--path", disk_dir)
    text = json.dumps(info)
    assert disk_dir in text
    # The store placement for the path as an NVMe directory: its device's node.
    p = info["paths"][0]
    sp = info["store_placement"]
    assert sp["nvme_dirs"] == [{"path": disk_dir, "device": p["device"] or "",
                                "numa_node": p["numa_node"]}]
    if not info["gpus"]:
        assert sp["gpu_numa_node"] is None
        assert sp["host_tier_numa_node"] == p["numa_node"]


def test_info_shows_the_placement_on_a_four_socket_topology():
    xml = os.path.join(os.path.dirname(__file__), "..", "store", "data",
                       "four_socket_gpu_nvme.xml")
    p = run("info", "--xml", xml, "--path", "/")
    assert "Store placement (these paths as NVMe directories, the first GPU)" in p.stdout
    assert "host tier: pinned memory on node 1 (GPU on node 1)" in p.stdout  # cuda0


def test_bench_adam_json():
    j = run_json("bench", "adam", "--numel", "100000", "--threads", "1", "--steps", "3",
                 "--warmup", "1")
    assert j["numel"] == 100000
    assert j["threads"] == 1
    assert j["seconds_per_step"] > 0
    assert j["ns_per_param"] == pytest.approx(j["seconds_per_step"] / 100000 * 1e9, rel=1e-6)
    assert j["gbps"] == pytest.approx(28 * 100000 / j["seconds_per_step"] / 1e9, rel=1e-6)
    assert j["fraction_of_limit"] == pytest.approx(j["gbps"] / j["mem_limit_gbps"], rel=1e-6)


def test_bench_store_and_store_commands(disk_dir):
    j = run_json("bench", "store", "--path", disk_dir, "--object-size", "4MiB", "--count", "2",
                 "--rounds", "1", "--chunk-size", "1MiB", "--keep")
    for k in ("put_gbps", "get_gbps", "engine_read_gbps", "engine_write_gbps"):
        assert j[k] > 0, k
    for k in ("put", "get", "engine_write", "engine_read"):  # process CPU-s per GB moved
        assert isinstance(j[k + "_cpu_seconds_per_gb"], float), k
        assert j[k + "_cpu_seconds_per_gb"] >= 0, k
    stores = [os.path.join(dp) for dp, _, fs in os.walk(disk_dir) if "catalog.db" in fs]
    assert stores, "bench store --keep left no store"
    ls = run_json("store", "ls", stores[0])
    assert len(ls) >= 2
    for obj in ls:
        assert obj["nbytes"] == 4 * 1024 * 1024
    v = run("store", "verify", stores[0])
    assert v.returncode == 0


def test_store_commands_report_damaged_catalog_rows(disk_dir):
    """Damaged catalog rows (edited in the SQLite catalog, as tests/store does): ls and stat
    still exit 0 and name the damage, ls --json has "damage", verify exits 1."""
    import sqlite3
    run("bench", "store", "--path", disk_dir, "--object-size", "16KiB", "--count", "3",
        "--rounds", "1", "--chunk-size", "1MiB", "--keep", "--json")
    store = os.path.join(disk_dir, "strata-bench-store")
    db = sqlite3.connect(os.path.join(store, "catalog.db"))
    db.execute("UPDATE objects SET nbytes=-16 WHERE key=CAST('bench/1' AS BLOB)")
    db.execute("UPDATE objects SET dtype=0, shape='9223372036854775807,4', nbytes=0 "
               "WHERE key=CAST('bench/2' AS BLOB)")
    db.execute("DELETE FROM chunks WHERE key=CAST('bench/2' AS BLOB)")
    db.commit()
    db.close()
    d1 = "object 'bench/1' chunks hold 16384 bytes, expected 18446744073709551600"
    d2 = "object 'bench/2' has shape fp32[9223372036854775807, 4] whose size overflows 64 bits"

    ls = run_json("store", "ls", store)
    assert [(o["key"], o["nbytes"], o["damage"]) for o in ls] == [
        ("bench/0", 16384, ""), ("bench/1", 2**64 - 16, d1), ("bench/2", 0, d2)]
    assert ls[2]["shape"] == [9223372036854775807, 4] and ls[2]["dtype"] == "fp32"

    p = run("store", "ls", store)
    lines = p.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["16.00", "KiB", "uint8", "[16384]", "bench/0"]
    assert lines[1].endswith(" bench/1  DAMAGED: " + d1)
    assert lines[2].endswith(" bench/2  DAMAGED: " + d2)
    assert lines[3] == "3 objects, 16.00 KiB, 2 damaged"

    p = run("store", "stat", store, "bench/0", "bench/2")
    assert "damage:" not in p.stdout.split("key:    bench/2")[0]
    assert p.stdout.count("damage: ") == 1
    assert "\ndamage: " + d2 + "\n" in p.stdout

    v = run("store", "verify", store, check=False)
    assert v.returncode == 1
    # (the open also logs "strata [warn] ... damaged catalog row: ..." lines)
    errors = [ln for ln in v.stderr.splitlines() if ln.startswith("strata: ")]
    assert errors == [f"strata: DataLoss: store {store}: {d1}",
                      f"strata: DataLoss: store {store}: {d2}"]
    assert v.stdout.endswith(": 2 errors\n")


def test_store_ls_missing_store_is_an_error(disk_dir):
    p = run("store", "ls", os.path.join(disk_dir, "nope"), check=False)
    assert p.returncode != 0
    assert "nope" in p.stderr


def test_launch_sets_torchrun_variables():
    p = run("launch", "--nproc", "3", "--", "/bin/sh", "-c",
            'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK a=$MASTER_ADDR p=${MASTER_PORT:+set}"')
    lines = sorted(l for l in p.stdout.splitlines() if "r=" in l)
    assert lines == [f"[rank {r}] r={r} w=3 l={r} a=127.0.0.1 p=set" for r in range(3)]


def test_launch_failing_rank_fails_the_job():
    p = run("launch", "--nproc", "2", "--", "/bin/sh", "-c",
            'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 30', check=False, timeout=60)
    assert p.returncode != 0
    assert "rank 1" in p.stderr


def test_bench_allgather_json():
    j = run_json("bench", "allgather", "--nproc", "2", "--bytes", "1MiB", "--iters", "3",
                 "--warmup", "1")
    assert j["nproc"] == 2
    assert j["bytes"] == 1024 * 1024
    assert j["backend"] == "gloo"
    assert j["algbw_gbps"] == pytest.approx(j["bytes"] / j["seconds"] / 1e9, rel=1e-6)
    assert j["busbw_gbps"] == pytest.approx(j["algbw_gbps"] * (2 - 1) / 2, rel=1e-6)


def test_bench_partitioned_read_json(disk_dir):
    j = run_json("bench", "partitioned-read", "--nproc", "2", "--bytes", "4MiB", "--path",
                 disk_dir, "--iters", "2")
    assert j["verified"] is True
    for k in ("seconds", "gbps", "read_seconds", "allgather_seconds"):
        assert j[k] > 0, k


def test_bench_step_json(disk_dir):
    j, rusage = run_json_rusage("bench", "step", "--params", "2000000", "--path", disk_dir,
                                "--host-budget", "256MiB", "--steps", "2", "--chunk-size", "1MiB",
                                "--tensor-numel", "1000000")
    assert j["params"] == 2000000
    # One step reads and writes each parameter and its two Adam states once (fp32: 12 B).
    assert (j["bytes_read"], j["bytes_written"]) == (12 * 2000000, 12 * 2000000)
    assert j["overlap_efficiency"] == pytest.approx(
        max(j["io_seconds"], j["compute_seconds"]) / j["step_seconds"], rel=1e-6)
    # The process's peak RSS when it wrote its result: at most the peak the kernel reports
    # for the whole run (ru_maxrss, KiB), and all but what printing the result added.
    assert j["peak_rss_bytes"] <= rusage.ru_maxrss * 1024
    assert j["peak_rss_bytes"] == pytest.approx(rusage.ru_maxrss * 1024, rel=0.05)
    assert j["state_dtype"] == "fp32"
    assert (j["bytes_read_per_param"], j["bytes_written_per_param"]) == (12.0, 12.0)
    # The device's time split (IoEngine::occupancy): the step and the probe each read and
    # wrote, so both had reads and writes in flight; the split of the step covers it.
    # The mean queue depth (piece-seconds over seconds in flight) is within [1, 32], the
    # engine's default queue depth (one worker); 1e-9: rounding.
    times = ["idle", "reads_and_writes", "reads_only", "writes_only"]
    for k in ("last_step_device_seconds", "last_io_probe_device_seconds"):
        d = j[k]
        assert sorted(d) == sorted(times + ["read_piece_seconds", "write_piece_seconds"]), k
        assert min(d.values()) >= 0, k
        for op, only in (("read", "reads_only"), ("write", "writes_only")):
            busy = d[only] + d["reads_and_writes"]
            assert busy > 0, (k, op)
            assert busy * (1 - 1e-9) <= d[op + "_piece_seconds"] <= 32 * busy * (1 + 1e-9), (k, op)
    step = j["last_step_device_seconds"]
    assert sum(step[t] for t in times) >= j["step_seconds_all"][-1]
    # Two untimed warm-up steps (the default) before the timed ones; the process's CPU time
    # of a step and of a probe.
    assert j["warmup_steps"] == 2 and len(j["warmup_step_seconds_all"]) == 2
    assert min(j["warmup_step_seconds_all"]) > 0
    assert j["step_cpu_seconds"] > 0 and j["io_cpu_seconds"] > 0


def test_bench_step_buffers_auto_fills_the_pinned_budget(disk_dir):
    # --buffers 0 (OffloadOptions::num_buffers auto): 256 MiB host budget - 40 MiB for the
    # store = 216 MiB pinned; 1 MiB chunks -> sub-groups of 262144 elements, 4 of them per
    # slot (4 MiB per stream, 12 MiB per Adam slot) -> 18 fit. The default stays 4.
    args = ("bench", "step", "--params", "2000000", "--path", disk_dir, "--host-budget",
            "256MiB", "--steps", "1", "--chunk-size", "1MiB", "--tensor-numel", "1000000")
    j = run_json(*args, "--buffers", "0")
    assert (j["sub_group_numel"], j["buffers"]) == (262144, 18)
    assert j["pinned_budget_bytes"] == 216 << 20
    assert (j["bytes_read"], j["bytes_written"]) == (12 * 2000000, 12 * 2000000)
    assert j["w0_0"] > 0
    assert run_json(*args)["buffers"] == 4


def test_bench_step_with_bf16_states_moves_8_bytes_per_parameter(disk_dir):
    j = run_json("bench", "step", "--params", "2000000", "--path", disk_dir, "--host-budget",
                 "256MiB", "--steps", "2", "--chunk-size", "1MiB", "--tensor-numel", "1000000",
                 "--state-dtype", "bf16")
    assert (j["params"], j["state_dtype"]) == (2000000, "bf16")
    # The fp32 master (4 B) and Adam's m and v as bf16 (2 B each), read and written once.
    assert (j["bytes_read"], j["bytes_written"]) == (8 * 2000000, 8 * 2000000)
    assert (j["bytes_read_per_param"], j["bytes_written_per_param"]) == (8.0, 8.0)
    assert j["w0_0"] > 0
    assert os.listdir(disk_dir) == []


def test_bench_step_refuses_a_bad_state_dtype(disk_dir):
    p = run("bench", "step", "--params", "10", "--path", disk_dir, "--state-dtype", "fp16",
            check=False)
    assert (p.returncode, p.stderr, p.stdout) == (
        1, "strata: error: InvalidArgument: --state-dtype must be fp32 or bf16, got 'fp16'\n", "")
    assert os.listdir(disk_dir) == []


@pytest.mark.parametrize("args, needle", [
    (["bench", "io", "--op", "write", "--size", "4MiB", "--block-size", "0"], "--block-size"),
    (["bench", "io", "--op", "write", "--size", "4MiB", "--file-name", "../escape.dat"], "--file-name"),
    (["bench", "io", "--op", "write", "--size", "4MiB", "--queue-depth", "0"], "--queue-depth"),
    (["bench", "adam", "--numel", "1000", "--steps", "1", "--warmup", "-1"], "--warmup"),
    (["bench", "adam", "--numel", "1000", "--steps", "0"], "--steps"),
    (["bench", "allgather", "--nproc", "1", "--bytes", "1MiB", "--warmup", "-3"], "--warmup"),
])
def test_bad_numbers_are_clean_errors(disk_dir, args, needle):
    if args[:2] == ["bench", "io"]:
        args = args[:2] + ["--path", disk_dir] + args[2:]
    p = run(*args, check=False)
    assert p.returncode not in (0, -8, -11, -6), p.returncode  # no success, SIGFPE, SIGSEGV, SIGABRT
    assert p.returncode > 0
    assert needle in p.stderr + p.stdout


# ---- issue 3: bench store with an empty --path, leftovers after errors, odd keys ---------

def test_bench_store_refuses_an_empty_path(disk_dir):
    root_before = os.path.exists("/strata-bench-store")
    for args in (["--path", ""], ["--path", disk_dir, "--path", ""]):
        p = run("bench", "store", *args, "--object-size", "4KiB", "--count", "1",
                "--rounds", "1", check=False)
        assert p.returncode == 1
        n = 1 if len(args) == 2 else 2
        assert p.stderr == ("strata: error: InvalidArgument: --path must name a directory, "
                            f"got an empty string (--path #{n})\n")
        assert p.stdout == ""
    assert os.path.exists("/strata-bench-store") == root_before
    assert os.listdir(disk_dir) == []  # refused before anything was created


def test_bench_store_leaves_nothing_behind(disk_dir):
    # An error after the store directory was created (10^6 x 1 MiB objects: 4 TiB do not fit
    # the disk) removes <path>/strata-bench-store, as does a run that succeeds.
    too_big = ["--object-size", "1MiB", "--count", "1000000", "--rounds", "1",
               "--chunk-size", "1MiB"]
    p = run("bench", "store", "--path", disk_dir, *too_big, check=False)
    assert p.returncode == 1
    assert p.stderr.startswith(
        "strata: error: ResourceExhausted: bench store (1000000 x 1MiB, 4 copies) needs "
        "4194305048576 bytes"), p.stderr  # 4 x 10^6 MiB + one chunk of striping imbalance
    assert os.listdir(disk_dir) == []
    j = run_json("bench", "store", "--path", disk_dir, "--object-size", "64KiB", "--count", "2",
                 "--rounds", "1", "--chunk-size", "1MiB")
    assert j["object_bytes"] == 65536 and j["count"] == 2
    assert os.listdir(disk_dir) == []
    # --keep keeps it after an error too.
    p = run("bench", "store", "--path", disk_dir, *too_big, "--keep", check=False)
    assert p.returncode == 1
    assert os.listdir(disk_dir) == ["strata-bench-store"]


def test_store_ls_and_stat_escape_unprintable_keys(disk_dir):
    """Keys holding NUL, control characters, a backslash or bytes that are not UTF-8 (renamed
    in the SQLite catalog, which stores keys as blobs) print whole and escaped."""
    import sqlite3
    run("bench", "store", "--path", disk_dir, "--object-size", "4KiB", "--count", "6",
        "--rounds", "1", "--chunk-size", "1MiB", "--keep", "--json")
    store = os.path.join(disk_dir, "strata-bench-store")
    keys = [b"a\x00b", b"esc\x1b[31m", b"nl\nx\ty", b"back\\slash", b"bad\xffutf8",
            "c1\u0085ключ".encode()]
    db = sqlite3.connect(os.path.join(store, "catalog.db"))
    for i, k in enumerate(keys):
        for table in ("objects", "chunks"):
            db.execute(f"UPDATE {table} SET key=? WHERE key=CAST(? AS BLOB)", (k, f"bench/{i}"))
    db.commit()
    db.close()
    escaped = {b"a\x00b": "a\\x00b", b"esc\x1b[31m": "esc\\x1b[31m", b"nl\nx\ty": "nl\\nx\\ty",
               b"back\\slash": "back\\\\slash", b"bad\xffutf8": "bad\\xffutf8",
               "c1\u0085ключ".encode(): "c1\\u0085ключ"}
    order = sorted(keys)  # the store lists keys bytewise
    p = run("store", "ls", store)
    lines = p.stdout.splitlines()
    assert [ln.split(None, 4)[4] for ln in lines[:-1]] == [escaped[k] for k in order]
    assert lines[-1] == "6 objects, 24.00 KiB"
    ls = run_json("store", "ls", store)
    assert [o["key_escaped"] for o in ls] == [escaped[k] for k in order]
    assert [o["key"] for o in ls] == [k.decode("utf-8", "replace") for k in order]
    assert ls[order.index(b"a\x00b")]["key"] == "a\x00b"  # JSON "a\u0000b", not cut short
    # stat and rm take the escaped form (no command line can carry a NUL byte).
    p = run("store", "stat", store, "a\\x00b", "back\\\\slash", "back\\slash")
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("key:")] == [
        "key:    a\\x00b", "key:    back\\\\slash", "key:    back\\\\slash"]
    run("store", "rm", store, "a\\x00b", "bad\\xffutf8")
    assert [o["key_escaped"] for o in run_json("store", "ls", store)] == [
        escaped[k] for k in order if k not in (b"a\x00b", b"bad\xffutf8")]
    p = run("store", "stat", store, "a\\x00b", check=False)
    assert p.returncode == 1
    assert "NotFound" in p.stderr
    # Error reports print control characters escaped (a key cannot recolor the terminal);
    # backslashes in messages stay as they are.
    p = run("store", "stat", store, "missing\x1b[31m\\", check=False)
    assert p.returncode == 1
    assert "'missing\\x1b[31m\\'" in p.stderr
    assert "\x1b" not in p.stderr


def test_store_rm_takes_keys_as_ls_prints_them(disk_dir):
    """A key holding NUL and the literal text of its escaped form: each form `ls` prints
    names the key it stands for (was: the literal key was removed for the NUL key's form)."""
    import sqlite3
    run("bench", "store", "--path", disk_dir, "--object-size", "4KiB", "--count", "2",
        "--rounds", "2", "--chunk-size", "1MiB", "--keep", "--json")
    store = os.path.join(disk_dir, "strata-bench-store")
    db = sqlite3.connect(os.path.join(store, "catalog.db"))
    for i, k in enumerate([b"a\x00b", b"a\\x00b"]):
        for table in ("objects", "chunks"):
            db.execute(f"UPDATE {table} SET key=? WHERE key=CAST(? AS BLOB)", (k, f"bench/{i}"))
    db.commit()
    db.close()
    assert [o["key_escaped"] for o in run_json("store", "ls", store)] == ["a\\x00b", "a\\\\x00b"]
    run("store", "rm", store, "a\\x00b")  # the NUL key, as ls prints it
    assert [o["key_escaped"] for o in run_json("store", "ls", store)] == ["a\\\\x00b"]
    run("store", "rm", store, "a\\\\x00b")  # the literal key, as ls prints it
    assert run_json("store", "ls", store) == []


# ---- benchmark hardening: wrapped negatives, overflow, memory/disk limits, odd options ----


def meminfo_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


NEG = "strata: error: InvalidArgument: {} must be a non-negative integer, got '{}'\n"


@pytest.mark.parametrize("args, flag, value", [
    (["bench", "step", "--params", "-5", "--path", "{d}"], "--params", "-5"),
    (["bench", "step", "--params=-5", "--path", "{d}"], "--params", "-5"),
    (["bench", "step", "--sub-group", "-1", "--path", "{d}"], "--sub-group", "-1"),
    (["bench", "step", "--tensor-numel", "-3", "--path", "{d}"], "--tensor-numel", "-3"),
    (["bench", "step", "--warmup-steps", "-1", "--path", "{d}"], "--warmup-steps", "-1"),
    (["bench", "adam", "--numel", "-5"], "--numel", "-5"),
    (["bench", "adam", "--numel", " -5"], "--numel", " -5"),
    (["bench", "io", "--path", "{d}", "--op", "write", "--queue-depth", "-1"], "--queue-depth", "-1"),
    (["bench", "io", "--path", "{d}", "--op", "write", "--workers", "-2"], "--workers", "-2"),
    (["bench", "allgather", "--master-port", "-1"], "--master-port", "-1"),
    (["bench", "partitioned-read", "--path", "{d}", "--master-port", "-7"], "--master-port", "-7"),
    (["bench", "store", "--path", "{d}", "--count", "-2"], "--count", "-2"),
    (["bench", "store", "--path", "{d}", "--rounds", "-1"], "--rounds", "-1"),
    (["bench", "device", "--rounds", "-4"], "--rounds", "-4"),
    (["launch", "--master-port", "-1", "-n", "1", "--", "/bin/true"], "--master-port", "-1"),
])
def test_negative_values_of_unsigned_options_are_refused(disk_dir, args, flag, value):
    # CLI11 converts unsigned options with strtoull, which wraps "-5" to 2^64 - 5.
    p = run(*[a.replace("{d}", disk_dir) for a in args], check=False, timeout=30)
    assert (p.returncode, p.stderr, p.stdout) == (1, NEG.format(flag, value), "")
    assert os.listdir(disk_dir) == []


def test_sizes_that_overflow_64_bits_are_invalid_arguments(disk_dir):
    p = run("bench", "step", "--params", "2000000000000000000", "--path", disk_dir, check=False)
    assert (p.returncode, p.stderr) == (1, (
        "strata: error: InvalidArgument: --params 2000000000000000000 needs 12 bytes of state "
        "each: 2000000000000000000 x 12 overflows 64 bits\n"))
    # 12 EB of state fits 64 bits, its disk need (2 copies + the 2-region probe) does not.
    p = run("bench", "step", "--params", "1000000000000000000", "--path", disk_dir, check=False)
    assert (p.returncode, p.stderr) == (1, (
        "strata: error: InvalidArgument: bench step --params 1000000000000000000 needs more "
        "than 2^64 bytes of disk per --path\n"))
    p = run("bench", "adam", "--numel", str(2**62), "--threads", "1", check=False)
    assert (p.returncode, p.stderr) == (1, (
        f"strata: error: InvalidArgument: --numel {2**62} needs 16 bytes per parameter: "
        f"{2**62} x 16 overflows 64 bits\n"))
    p = run("bench", "io", "--path", disk_dir, "--size", "1MiB", "--op", "write",
            "--request-size", "16000000TiB", check=False)
    assert (p.returncode, p.stderr) == (1, (
        "strata: error: InvalidArgument: bench io buffer: 2 requests outstanding of "
        "--request-size: 2 x 17592186044416000000 overflows 64 bits\n"))
    for size, count in ((2**63, 1), (2147483649, 2147483647)):
        p = run("bench", "store", "--path", disk_dir, "--object-size", str(size), "--count",
                str(count), "--rounds", "1", check=False)
        assert (p.returncode, p.stderr) == (1, (
            f"strata: error: InvalidArgument: bench store: --object-size {size} x --count "
            f"{count} needs more than 2^64 bytes of disk per --path\n"))
    assert os.listdir(disk_dir) == []


@pytest.mark.parametrize("lock_name", ["LOCK", "bench.lock"])
def test_bench_store_leaves_a_directory_in_use_alone(disk_dir, lock_name):
    """Was: a second `bench store` on the same --path removed the running one's store, or
    (bench.lock: a directory that is another running bench's second --path, where no store
    LOCK exists) its data file."""
    import fcntl
    store = os.path.join(disk_dir, "strata-bench-store")
    os.makedirs(store)
    lock_path = os.path.join(store, lock_name)
    with open(lock_path, "w") as lock:
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as Store.open / bench store do
        open(os.path.join(store, "data"), "w").close()
        p = run("bench", "store", "--path", disk_dir, "--object-size", "4KiB", "--count", "1",
                "--rounds", "1", check=False)
    assert (p.returncode, p.stderr, p.stdout) == (1, (
        f"strata: error: FailedPrecondition: {store} is in use by pid {os.getpid()} "
        f"({lock_path} is locked: a store open for writing, or another benchmark on this "
        "--path); nothing was removed\n"), "")
    assert sorted(os.listdir(store)) == sorted([lock_name, "data"])
    # Unlocked (the holder is gone): the directory is the bench's to replace.
    run("bench", "store", "--path", disk_dir, "--object-size", "4KiB", "--count", "1",
        "--rounds", "1")
    assert os.listdir(disk_dir) == []


def test_bench_store_chunk_size_must_be_a_multiple_of_4096(disk_dir):
    for c in ("0", "1", "4097"):
        p = run("bench", "store", "--path", disk_dir, "--object-size", "4KiB", "--count", "1",
                "--chunk-size", c, check=False)
        assert (p.returncode, p.stderr) == (1, (
            f"strata: error: InvalidArgument: --chunk-size {c} is not a positive multiple of "
            "4096\n"))
    assert os.listdir(disk_dir) == []


def test_bench_adam_refuses_zero_params_and_more_than_memory():
    p = run("bench", "adam", "--numel", "0", check=False)
    assert (p.returncode, p.stderr) == (1, "strata: error: InvalidArgument: --numel must be >= 1, got 0\n")
    n = 2**56  # 16 B/param for Adam with fp32 gradients: 2^60 bytes
    p = run("bench", "adam", "--numel", str(n), "--threads", "1", check=False)
    m = error_match(
        p,
        rf"strata: error: ResourceExhausted: bench adam --numel {n} \(16 B/param\) needs "
        rf"{16 * n} bytes \(\d+\.\d\d GiB\) of memory, but only (\d+) bytes \(\d+\.\d\d GiB\) "
        r"are available \(MemAvailable\)\n")
    assert abs(int(m[1]) - meminfo_available()) < 2**30


def test_bench_step_with_one_param(disk_dir):
    j = run_json("bench", "step", "--params", "1", "--path", disk_dir, "--host-budget", "64MiB",
                 "--steps", "2", "--chunk-size", "1MiB", timeout=30)
    assert (j["params"], j["tensors"], j["steps"], j["warmup_steps"]) == (1, 1, 2, 2)
    assert (j["bytes_read"], j["bytes_written"]) == (12, 12)
    # w0[0]: gradient -1e-3 at each step (2 warm-up + 2 timed); each Adam step adds
    # lr |g| / (|g| + eps).
    assert j["w0_0"] == pytest.approx(4 * 1e-4 * 1e-3 / (1e-3 + 1e-8), rel=1e-6)
    j = run_json("bench", "step", "--params", "1", "--path", disk_dir, "--host-budget", "64MiB",
                 "--steps", "1", "--warmup-steps", "0", "--chunk-size", "1MiB", timeout=30)
    assert (j["warmup_steps"], j["warmup_step_seconds_all"]) == (0, [])
    assert j["w0_0"] == pytest.approx(1e-4 * 1e-3 / (1e-3 + 1e-8), rel=1e-6)
    assert os.listdir(disk_dir) == []


def _free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_bench_step_and_io_refuse_to_fill_the_disk(disk_dir):
    params = 100000000000000
    p = run("bench", "step", "--params", str(params), "--path", disk_dir, check=False)
    chunk = 64 * 2**20
    # state x 2 (copy-on-write) + probe file (two regions of the state, rounded up to the
    # chunk) + one chunk
    need = 2 * 12 * params + 2 * (-(-12 * params // chunk) * chunk) + chunk
    m = error_match(
        p,
        rf"strata: error: ResourceExhausted: bench step --params {params} needs {need} bytes "
        rf"\(\d+\.\d\d GiB\) on the file system of --path #1 '{re.escape(disk_dir)}', which has "
        r"(\d+) bytes \(\d+\.\d\d GiB\) available\n")
    assert abs(int(m[1]) - _free(disk_dir)) < 2**30
    assert os.listdir(disk_dir) == []

    a, b = os.path.join(disk_dir, "a"), os.path.join(disk_dir, "b")
    os.mkdir(a)
    os.mkdir(b)
    p = run("bench", "io", "--size", "100TiB", "--op", "write", "--path", a, "--path", b,
            check=False)
    m = error_match(
        p,
        rf"strata: error: ResourceExhausted: bench io --size 100TiB needs {100 * 2**40} bytes "
        rf"\(102400.00 GiB\) on the file system of --path #1 '{re.escape(a)}' and --path #2 "
        rf"'{re.escape(b)}', which has (\d+) bytes \(\d+\.\d\d GiB\) available\n")
    assert os.listdir(a) == [] and os.listdir(b) == []


def _fsize_limit(nbytes):
    import resource
    import signal

    def f():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return f


def test_bench_step_reports_a_failed_probe_write_and_removes_its_files(disk_dir):
    # RLIMIT_FSIZE (4 MiB) fails the writes of the I/O probe's file (2 x 24 MB, written
    # before the store's tensors, with several writes in flight) with EFBIG.
    f = os.path.join(disk_dir, "strata-bench-step", "io_probe.dat")
    p = subprocess.run([STRATA, "bench", "step", "--params", "2000000", "--path", disk_dir,
                        "--host-budget", "256MiB", "--chunk-size", "1MiB", "--json"],
                       capture_output=True, text=True, timeout=60,
                       preexec_fn=_fsize_limit(4 * 2**20))
    assert (p.returncode, p.stdout) == (1, "")
    assert re.fullmatch(rf"strata: error: IoError: write of '{re.escape(f)}' at offset \d+, "
                        r"length \d+( \(after \d+ bytes\))? \(errno 27: File too large\)\n",
                        p.stderr), p.stderr
    assert os.listdir(disk_dir) == []


def test_bench_io_removes_its_file_after_a_failure(disk_dir):
    # RLIMIT_FSIZE makes writes past 256 KiB fail with EFBIG, as a full disk would.
    f = os.path.join(disk_dir, "strata-bench-io.dat")
    args = [STRATA, "bench", "io", "--path", disk_dir, "--size", "1MiB", "--block-size", "64KiB"]
    p = subprocess.run(args + ["--op", "write"], capture_output=True, text=True, timeout=30,
                       preexec_fn=_fsize_limit(256 * 1024))
    assert p.returncode == 1
    assert re.fullmatch(rf"strata: error: IoError: write of '{re.escape(f)}' at offset \d+, "
                        r"length 65536 \(errno 27: File too large\)\n", p.stderr), p.stderr
    assert os.listdir(disk_dir) == []
    # A file that existed is truncated back to its size (the read's layout grew it).
    with open(f, "wb") as fh:
        fh.truncate(65536)
    p = subprocess.run(args + ["--op", "read"], capture_output=True, text=True, timeout=30,
                       preexec_fn=_fsize_limit(256 * 1024))
    assert p.returncode == 1
    assert "laying out the read file: write of" in p.stderr
    assert os.path.getsize(f) == 65536
    os.unlink(f)
    # --keep keeps the partial file.
    p = subprocess.run(args + ["--op", "write", "--keep"], capture_output=True, text=True,
                       timeout=30, preexec_fn=_fsize_limit(256 * 1024))
    assert p.returncode == 1
    assert os.listdir(disk_dir) == ["strata-bench-io.dat"]
    assert os.path.getsize(f) == 256 * 1024


def test_bench_io_refuses_a_directory_given_twice(disk_dir):
    a = os.path.join(disk_dir, "a")
    os.mkdir(a)
    os.symlink(a, os.path.join(disk_dir, "link"))
    for second, how in ((a + "/", f"({a})"), (os.path.join(disk_dir, "a", "..", "a"), f"({a})"),
                        (os.path.join(disk_dir, "link"), f"({a})")):
        p = run("bench", "io", "--path", a, "--path", second, "--size", "1MiB", "--op", "write",
                check=False)
        assert (p.returncode, p.stderr) == (1, (
            f"strata: error: InvalidArgument: --path #1 '{a}' and --path #2 '{second}' are the "
            f"same directory {how}: each directory may be listed once\n"))
    assert os.listdir(a) == []
    p = run("bench", "step", "--params", "10", "--path", a, "--path", a, check=False)
    assert p.stderr == (f"strata: error: InvalidArgument: --path #1 '{a}' and --path #2 '{a}' are "
                        f"the same directory ({a}): each directory may be listed once\n")


def test_bench_partitioned_read_refuses_more_than_memory(disk_dir):
    s, n, piece = 4096 * 2**40, 2, 8 * 2**20  # 4096 TiB over 2 ranks
    c = (s + n - 1) // n
    per_rank = 2 * s + n * c + 2 * c + (3 + 2 * n) * piece
    p = run("bench", "partitioned-read", "--nproc", n, "--bytes", "4096TiB", "--path", disk_dir,
            check=False)
    m = error_match(
        p,
        rf"strata: error: ResourceExhausted: bench partitioned-read --nproc 2 --bytes 4096TiB "
        rf"\({per_rank} bytes per rank\) needs {n * per_rank} bytes \(\d+\.\d\d GiB\) of memory, "
        r"but only (\d+) bytes \(\d+\.\d\d GiB\) are available \(MemAvailable\)\n")
    assert os.listdir(disk_dir) == []
    h = run("bench", "partitioned-read", "--help").stdout
    assert "2 x S + (N + 2) x ceil(S/N) + (3 + 2N) x piece bytes" in h
    assert "MemAvailable" in h


@pytest.mark.parametrize("piece, nbytes", [("0", 0), ("3", 3), ("6KiB", 6144)])
def test_bench_partitioned_read_piece_must_be_a_multiple_of_4096(disk_dir, piece, nbytes):
    p = run("bench", "partitioned-read", "--nproc", "2", "--bytes", "1MiB", "--path", disk_dir,
            "--piece-bytes", piece, check=False)
    assert (p.returncode, p.stderr) == (1, (
        f"strata: error: InvalidArgument: --piece-bytes '{piece}' ({nbytes} bytes) must be a "
        "positive multiple of 4096\n"))


def test_bench_allgather_reports_the_bytes_measured():
    j = run_json("bench", "allgather", "--nproc", "3", "--bytes", "1000001", "--iters", "1",
                 "--warmup", "0", timeout=60)
    assert (j["bytes"], j["bytes_requested"], j["bytes_per_rank"]) == (999999, 1000001, 333333)
    assert j["algbw_gbps"] == pytest.approx(999999 / j["seconds"] / 1e9, rel=1e-6)
    assert j["verified"] is True
    p = run("bench", "allgather", "--nproc", "3", "--bytes", "1000001", "--iters", "1",
            "--warmup", "0", timeout=60)
    assert ("  note: --bytes 1000001 is not a multiple of nproc 3: measured 999999 bytes "
            "(3 x 333333 per rank)\n") in p.stdout
    p = run("bench", "allgather", "--nproc", "2", "--bytes", "4KiB", "--iters", "1", timeout=60)
    assert "note:" not in p.stdout
    assert "N x floor(S/N) bytes are measured" in run("bench", "allgather", "--help").stdout


def test_launch_n_is_an_alias_of_nproc():
    for flag in ("-n", "--nproc", "--nproc-per-node"):
        p = run("launch", flag, "2", "--", "/bin/sh", "-c", 'echo "r=$RANK w=$WORLD_SIZE"')
        assert sorted(l for l in p.stdout.splitlines()) == [
            "[rank 0] r=0 w=2", "[rank 1] r=1 w=2"]


def test_gloo_timeout_names_the_rank_that_never_joined():
    # Rank 1 exits before creating its communicator: it never connected to the rendezvous
    # server, so rank 0 must not claim that every rank is connected.
    env = dict(os.environ, STRATA_COLL_TIMEOUT_MS="1000")
    p = subprocess.run(
        [STRATA, "launch", "-n", "2", "--", "/bin/sh", "-c",
         f'if [ "$RANK" = 1 ]; then exit 0; fi; exec "{STRATA}" bench allgather --from-env '
         "--bytes 4KiB --iters 1"], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 1
    lines = p.stderr.splitlines()
    head = ("[rank 0] strata: error: DeadlineExceeded: rank 0: Gloo rendezvous on host "
            "'127.0.0.1' failed: no answer from a peer within 1000 ms (rank 1 has not published a "
            "Gloo address: not started, exited before creating its communicator, or hung before "
            "it; the rendezvous server sees rank 0 connected; rank 1 is not connected to it); "
            "transport error: DeadlineExceeded: rank 0: timed out after 1000 ms waiting for "
            "key(s) ['strata/comm0/gloo/1'] in the rendezvous store at 127.0.0.1:")
    assert lines[0].startswith(head), p.stderr
    assert "still connected" not in p.stderr
    assert lines[1:] == ["strata launch: rank 0 exited with status 1; the other ranks were stopped"]


def _bench_io_stderr(disk_dir, stderr_tty, env_progress=None):
    """stderr of a small `strata bench io` write, to a pseudo-terminal or a pipe."""
    import pty
    env = dict(os.environ)
    env.pop("STRATA_PROGRESS", None)
    if env_progress is not None:
        env["STRATA_PROGRESS"] = env_progress
    args = [STRATA, "bench", "io", "--path", disk_dir, "--size", "8MiB", "--block-size", "1MiB",
            "--queue-depth", "4", "--op", "write", "--json"]
    if not stderr_tty:
        p = subprocess.run(args, capture_output=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        return p.stderr.decode()  # bytes as written: text mode would turn "\r" into "\n"
    master, slave = pty.openpty()
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=slave, timeout=120, env=env)
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not b:
                break
            chunks.append(b)
        assert p.returncode == 0
        json.loads(p.stdout)  # stdout holds only the JSON object
        return b"".join(chunks).decode()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_progress_is_drawn_on_a_terminal_and_erased(disk_dir):
    err = _bench_io_stderr(disk_dir, stderr_tty=True)
    # the first update draws at once: "<label>: <done> / 8.00 MiB, <rate> MB/s (<pct>%)"
    m = re.search(r"\r  write: [0-9.]+ [KMG]?i?B / 8\.00 MiB, [0-9]+ MB/s \([0-9]+%", err)
    assert m, repr(err)
    # and the line is erased at the end (blanks then carriage return), leaving no text behind
    assert re.search(r"\r +\r$", err), repr(err)


def test_progress_is_quiet_when_piped_or_disabled(disk_dir):
    assert "\r" not in _bench_io_stderr(disk_dir, stderr_tty=False)
    assert "\r" not in _bench_io_stderr(disk_dir, stderr_tty=True, env_progress="0")
    # STRATA_PROGRESS=1 draws even into a pipe
    assert "\r  write: " in _bench_io_stderr(disk_dir, stderr_tty=False, env_progress="1")

