"""End-to-end tests of the `strata` tool: each command runs for real on small sizes and its
JSON output is checked field by field."""
import json
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
                 "--queue-depth", "4", "--op", "write", "--engine", engine)
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
    assert os.path.getsize(os.path.join(disk_dir, "strata-bench-io.dat")) == 8 * 1024 * 1024


def test_bench_io_striped_over_two_dirs(disk_dir):
    a, b = os.path.join(disk_dir, "a"), os.path.join(disk_dir, "b")
    os.mkdir(a)
    os.mkdir(b)
    r = run_json("bench", "io", "--path", a, "--path", b, "--size", "4MiB", "--block-size",
                 "256KiB", "--queue-depth", "8", "--op", "read")
    assert r["bytes"] == 4 * 1024 * 1024
    assert os.path.getsize(os.path.join(a, "strata-bench-io.dat")) == 2 * 1024 * 1024
    assert os.path.getsize(os.path.join(b, "strata-bench-io.dat")) == 2 * 1024 * 1024


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
    j = run_json("bench", "step", "--params", "2000000", "--path", disk_dir, "--host-budget",
                 "256MiB", "--steps", "2", "--chunk-size", "1MiB", "--tensor-numel", "1000000")
    assert j["params"] == 2000000
    assert j["bytes_read"] == 2 * 12 * 2000000 or j["bytes_read"] >= 12 * 2000000
    assert j["overlap_efficiency"] == pytest.approx(
        max(j["io_seconds"], j["compute_seconds"]) / j["step_seconds"], rel=1e-6)
    assert j["peak_rss_bytes"] > 0


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
    # An error after the store was created (16 TiB objects: the raw file's preallocation
    # or the buffer fails) removes <path>/strata-bench-store, as does a run that succeeds.
    p = run("bench", "store", "--path", disk_dir, "--object-size", "16TiB", "--count", "1",
            "--rounds", "1", "--chunk-size", "1MiB", check=False)
    assert p.returncode == 1
    assert p.stderr.startswith("strata: error: ")
    assert os.listdir(disk_dir) == []
    j = run_json("bench", "store", "--path", disk_dir, "--object-size", "64KiB", "--count", "2",
                 "--rounds", "1", "--chunk-size", "1MiB")
    assert j["object_bytes"] == 65536 and j["count"] == 2
    assert os.listdir(disk_dir) == []
    # --keep keeps it after an error too.
    p = run("bench", "store", "--path", disk_dir, "--object-size", "16TiB", "--count", "1",
            "--rounds", "1", "--chunk-size", "1MiB", "--keep", check=False)
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
