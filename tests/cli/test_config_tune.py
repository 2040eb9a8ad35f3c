"""`strata tune` and `--config FILE` on the commands that open a store or an engine: the
file's values reach the command (checked in its JSON output), the precedence defaults < file
< STRATA_* < options, and the errors for unknown keys and bad values."""
import json
import os
import re
import subprocess
import tempfile

import pytest

STRATA = os.environ.get("STRATA_CLI", "strata")


def run(*args, env=None, check=True):
    e = dict(os.environ)
    e.pop("STRATA_CONFIG", None)
    e.update(env or {})
    p = subprocess.run([STRATA, *map(str, args)], capture_output=True, text=True, timeout=300,
                       env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


def run_json(*args, **kw):
    out = run(*args, "--json", **kw).stdout.strip()
    try:
        return json.loads(out)  # info: one indented object
    except json.JSONDecodeError:  # progress lines before a one-line JSON object
        return json.loads(out.splitlines()[-1])


@pytest.fixture
def disk_dir():
    d = tempfile.mkdtemp(prefix="strata-cfg-", dir="/var/tmp")
    yield d
    subprocess.run(["rm", "-rf", d])


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def bench_io(d, *extra, **kw):
    return run_json("bench", "io", "--path", d, "--size", "8MiB", *extra, **kw)


def test_quick_tune_writes_a_file_every_entry_point_accepts(disk_dir):
    out = os.path.join(disk_dir, "strata.json")
    j = run_json("tune", "--path", disk_dir, "--quick", "--output", out)
    assert len(j["configs"]) == 4  # 2 block sizes x 2 queue depths x 1 worker count
    assert {(c["block_size"], c["queue_depth"], c["workers"]) for c in j["configs"]} == {
        (131072, 4, 1), (1048576, 4, 1), (131072, 16, 1), (1048576, 16, 1)}
    assert all(c["read_gbps"] > 0 and c["write_gbps"] > 0 for c in j["configs"])
    best = max(c["read_gbps"] for c in j["configs"])
    chosen = j["chosen"]
    assert chosen["read_gbps"] >= 0.97 * best
    assert j["stripe_units"] == []  # one path: no stripe unit sweep
    assert not os.path.exists(os.path.join(disk_dir, "strata-tune.dat"))  # removed

    cfg = json.load(open(out))
    assert list(cfg) == ["strata_config", "io", "measured"]
    assert cfg["strata_config"] == 1
    assert cfg["io"] == {"engine": "uring", "block_size": chosen["block_size"],
                         "queue_depth": chosen["queue_depth"], "workers": chosen["workers"]}
    m = cfg["measured"]
    assert m["paths"] == [disk_dir]
    assert m["nvme_read_bytes_per_s"] == pytest.approx(chosen["read_gbps"] * 1e9, rel=1e-9)
    assert m["nvme_write_bytes_per_s"] == pytest.approx(chosen["write_gbps"] * 1e9, rel=1e-9)
    assert m["memory_copy_bytes_per_s"] == pytest.approx(j["memory_copy_gbps"] * 1e9, rel=1e-9)
    assert m["adam_params_per_s"] == pytest.approx(j["adam_params_per_s"], rel=1e-9)
    assert all(m[k] > 0 for k in ("memory_copy_bytes_per_s", "adam_params_per_s"))
    # the store's data path with the chosen engine settings and the default chunk
    st = j["store"]
    assert (st["object_bytes"], st["count"], st["rounds"], st["chunk_bytes"]) == (
        4 << 20, 2, 2, 64 << 20)
    assert m["store_read_bytes_per_s"] == pytest.approx(st["read_gbps"] * 1e9, rel=1e-9)
    assert m["store_write_bytes_per_s"] == pytest.approx(st["write_gbps"] * 1e9, rel=1e-9)
    assert all(st[k] > 0 for k in ("read_gbps", "write_gbps", "engine_read_gbps",
                                   "engine_write_gbps"))
    assert not os.path.exists(os.path.join(disk_dir, "strata-tune-store"))  # removed

    # bench io and info take the tuned engine settings from it
    b = bench_io(disk_dir, "--config", out)
    assert (b["block_size"], b["queue_depth"], b["workers"], b["engine"]) == (
        chosen["block_size"], chosen["queue_depth"], chosen["workers"], "uring")
    s = run_json("info", "--config", out)["settings"]
    assert s["config_file"] == out
    assert s["io"]["block_size"] == chosen["block_size"]
    assert s["io"]["queue_depth"] == chosen["queue_depth"]
    # ... and so does STRATA_CONFIG
    assert bench_io(disk_dir, env={"STRATA_CONFIG": out})["block_size"] == chosen["block_size"]

    # Rerunning updates the file in place (round trip: same keys); an unknown key added to
    # it stops the rerun before it measures anything, naming key and file.
    run("tune", "--path", disk_dir, "--quick", "--output", out)
    again = json.load(open(out))
    assert list(again) == list(cfg) and list(again["io"]) == list(cfg["io"])
    again["io"]["queue_dpeth"] = 8
    write(out, again)
    p = run("tune", "--path", disk_dir, "--quick", "--output", out, check=False)
    assert p.returncode == 1
    assert (f"config file '{out}': unknown key 'io.queue_dpeth' (did you mean "
            "'io.queue_depth'?)") in p.stderr, p.stderr
    assert "tune --output" in p.stderr
    assert json.load(open(out))["io"]["queue_dpeth"] == 8  # left as it was


def test_tune_over_two_paths_sweeps_the_stripe_unit(disk_dir):
    a, b = os.path.join(disk_dir, "a"), os.path.join(disk_dir, "b")
    os.mkdir(a)
    os.mkdir(b)
    out = os.path.join(disk_dir, "t.json")
    j = run_json("tune", "--path", a, "--path", b, "--quick", "--output", out)
    assert [u["stripe_unit"] for u in j["stripe_units"]] == [1 << 20, 4 << 20]
    cfg = json.load(open(out))
    assert cfg["store"] == {"nvme_dirs": [a, b], "chunk_bytes": j["chosen"]["stripe_unit"]}
    assert cfg["measured"]["paths"] == [a, b]
    # the store run stripes over both paths with the chosen chunk, >= one chunk per path
    st = j["store"]
    assert st["chunk_bytes"] == j["chosen"]["stripe_unit"]
    assert st["object_bytes"] == max(4 << 20, 2 * st["chunk_bytes"])
    assert cfg["measured"]["store_read_bytes_per_s"] == pytest.approx(st["read_gbps"] * 1e9,
                                                                      rel=1e-9)
    assert not os.path.exists(os.path.join(a, "strata-tune-store"))
    assert not os.path.exists(os.path.join(b, "strata-tune-store"))
    # the stripe unit of bench io over several paths comes from store.chunk_bytes
    r = run_json("bench", "io", "--path", a, "--path", b, "--size", "16MiB", "--config", out)
    assert r["stripe_unit"] == cfg["store"]["chunk_bytes"]


def test_bench_io_precedence_file_env_option(disk_dir):
    f = write(os.path.join(disk_dir, "c.json"),
              {"io": {"block_size": "256KiB", "queue_depth": 8, "workers": 2,
                      "engine": "threads"}, "store": {"chunk_bytes": "512KiB"}})
    j = bench_io(disk_dir)  # built-in defaults
    assert (j["block_size"], j["queue_depth"], j["workers"], j["engine"]) == (1 << 20, 32, 1, "uring")
    j = bench_io(disk_dir, "--config", f)  # the file
    assert (j["block_size"], j["queue_depth"], j["workers"], j["engine"]) == (256 << 10, 8, 2, "threads")
    assert j["stripe_unit"] == 512 << 10
    env = {"STRATA_QUEUE_DEPTH": "16", "STRATA_BLOCK_SIZE": "128KiB"}
    j = bench_io(disk_dir, "--config", f, env=env)  # the environment over the file
    assert (j["block_size"], j["queue_depth"], j["workers"]) == (128 << 10, 16, 2)
    j = bench_io(disk_dir, "--config", f, "--queue-depth", "4", "--engine", "uring", env=env)
    assert (j["block_size"], j["queue_depth"], j["workers"], j["engine"]) == (128 << 10, 4, 2, "uring")
    # --config names a file other than STRATA_CONFIG's: --config wins
    g = write(os.path.join(disk_dir, "g.json"), {"io": {"queue_depth": 3}})
    assert bench_io(disk_dir, "--config", g, env={"STRATA_CONFIG": f})["queue_depth"] == 3


@pytest.mark.parametrize("cmd", [
    ["bench", "io", "--path", "{d}", "--size", "1MiB"],
    ["store", "ls", "{d}"], ["store", "stat", "{d}", "k"], ["store", "verify", "{d}"],
    ["info"],
    ["bench", "store", "--path", "{d}", "--object-size", "64KiB", "--count", "1", "--rounds", "1"],
    ["bench", "step", "--path", "{d}", "--params", "1000", "--steps", "1"],
    ["bench", "partitioned-read", "--path", "{d}", "--nproc", "1", "--bytes", "1MiB"],
])
def test_every_command_refuses_a_bad_file_naming_key_and_file(disk_dir, cmd):
    f = write(os.path.join(disk_dir, "bad.json"), {"store": {"chunk_byte": 4096}})
    args = [a.replace("{d}", disk_dir) for a in cmd]
    p = run(*args, "--config", f, check=False)
    assert p.returncode == 1
    assert re.search(rf"config file '{re.escape(f)}': unknown key 'store.chunk_byte' "
                     r"\(did you mean 'store.chunk_bytes'\?\)", p.stderr), p.stderr
    # the same through STRATA_CONFIG
    p = run(*args, check=False, env={"STRATA_CONFIG": f})
    assert p.returncode == 1 and "unknown key 'store.chunk_byte'" in p.stderr, p.stderr


def test_bad_values_and_malformed_files(disk_dir):
    f = write(os.path.join(disk_dir, "v.json"), {"io": {"queue_depth": 0}})
    p = run("info", "--config", f, check=False)
    assert p.stderr == (f"strata: error: InvalidArgument: config file '{f}': io.queue_depth: "
                        "expected an integer in 1..4096, got 0\n")
    m = os.path.join(disk_dir, "m.json")
    with open(m, "w") as fh:
        fh.write('{"io": {\n  "queue_depth": 8\n')
    p = run("info", "--config", m, check=False)
    assert p.returncode == 1
    assert f"config file '{m}': parse error at line 3, column 1" in p.stderr, p.stderr
    missing = os.path.join(disk_dir, "none.json")
    p = run("info", "--config", missing, check=False)
    assert p.returncode == 1
    assert f"config file '{missing}'" in p.stderr and "NotFound" in p.stderr, p.stderr
