"""End-to-end tests of `strata plan`: its JSON on known inputs, its inputs (config file,
bench JSON, flags, precedence) and clear errors on bad input."""
import json
import os
import subprocess

import pytest

STRATA = os.environ.get("STRATA_CLI", "strata")

# The optimizer step alone on CPU-only ranks, as `strata bench step` runs it.
STEP = ["plan", "--params", "100M", "--gpus", "0", "--nodes", "1", "--phase", "optimizer",
        "--offload", "optimizer"]


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("STRATA_CONFIG", None)
    e.update(env or {})
    return subprocess.run([STRATA, *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=e)


def plan_json(*args, **kw):
    p = run(*args, "--json", **kw)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def test_plan_json_optimizer_step_known_values():
    j = plan_json(*STEP, "--nvme-read-bw", "1G", "--nvme-write-bw", "2G",
                  "--adam-params-per-s", "200M")
    # 1.2 GB read at 1 GB/s + 1.2 GB written at 2 GB/s, Adam 0.5 s over 6 sub-groups.
    assert j["predicted_step_seconds"] == pytest.approx(1.8 + 0.5 / 6, rel=1e-12)
    assert j["bottleneck"] == "nvme"
    [ph] = j["phases"]
    assert ph["phase"] == "optimizer_step" and ph["pipeline_items"] == 6
    assert [t["tier"] for t in ph["tiers"]] == ["nvme", "cpu_adam"]
    assert ph["tiers"][1]["seconds"] == pytest.approx(0.5, rel=1e-12)
    assert j["measurements"]["adam_params_per_s"] == {"value": 2e8, "source": "--adam-params-per-s"}
    assert j["inputs"]["ranks"] == 1


def test_plan_iteration_json_has_efficiencies_and_requirements():
    j = plan_json("plan", "--params", "1e9", "--gpus", "8", "--nodes", "1", "--batch", "4",
                  "--peak-tflops", "100", "--nvme-read-bw", "25G", "--nvme-write-bw", "20G",
                  "--pcie-bw", "12G", "--allgather-bw", "100G", "--adam-params-per-s", "1G")
    assert j["predicted_step_seconds"] == pytest.approx(0.56768 + 1.305, rel=1e-12)
    assert j["bottleneck"] == "nvme"
    assert j["efficiencies"]["params_grads"] == pytest.approx(0.32768 / 0.56768, rel=1e-12)
    # The paper's 50% point for seq 1024 x batch 4 at 100 TFLOP/s: 1e14 / 4096 B/s.
    assert j["requirements"]["params_grads_bytes_per_s_for_50pct"] == pytest.approx(1e14 / 4096)
    assert j["requirements"]["optimizer_bytes_per_s_for_50pct"] == pytest.approx(4e14 / 4096)


def test_measurements_from_config_then_bench_then_flags(tmp_path):
    cfg = write(tmp_path, "cfg.json", {"strata_config": 1, "measured": {
        "nvme_read_bytes_per_s": 1e9, "nvme_write_bytes_per_s": 1e9, "adam_params_per_s": 1e8,
        "memory_copy_bytes_per_s": 5e9, "paths": ["/x"]}})
    bench = write(tmp_path, "w.json", {"op": "write", "gbps": 2.0})
    j = plan_json(*STEP, "--config", cfg, "--from-bench", bench, "--adam-params-per-s", "2e8")
    m = j["measurements"]
    assert m["nvme_read_bytes_per_s"] == {"value": 1e9, "source": "config " + cfg}
    assert m["nvme_write_bytes_per_s"] == {"value": 2e9, "source": "bench " + bench}
    assert m["adam_params_per_s"]["value"] == 2e8
    assert j["predicted_step_seconds"] == pytest.approx(1.8 + 0.5 / 6, rel=1e-12)
    # STRATA_CONFIG names the file when --config does not.
    k = plan_json(*STEP, env={"STRATA_CONFIG": cfg})
    assert k["measurements"]["nvme_read_bytes_per_s"]["source"] == "config " + cfg


def test_store_rates_in_the_config_win_over_the_raw_engine_rates(tmp_path):
    # `strata tune` writes both; the offloaded step goes through the store's data path
    cfg = write(tmp_path, "cfg.json", {"strata_config": 1, "measured": {
        "nvme_read_bytes_per_s": 2e9, "nvme_write_bytes_per_s": 2e9,
        "store_read_bytes_per_s": 1e9, "store_write_bytes_per_s": 1e9,
        "adam_params_per_s": 2e8, "memory_copy_bytes_per_s": 5e9}})
    j = plan_json(*STEP, "--config", cfg)
    m = j["measurements"]
    assert m["nvme_read_bytes_per_s"] == {"value": 1e9, "source": "config " + cfg}
    assert m["nvme_write_bytes_per_s"] == {"value": 1e9, "source": "config " + cfg}
    # the same figures as the flags give
    k = plan_json(*STEP, "--nvme-read-bw", "1e9", "--nvme-write-bw", "1e9",
                  "--adam-params-per-s", "2e8", "--memory-bw", "5e9")
    assert j["predicted_step_seconds"] == k["predicted_step_seconds"]


def error_of(p):
    assert p.returncode != 0 and p.stdout == ""
    return p.stderr


@pytest.mark.parametrize("args,message", [
    (["--params", "0"], "--params must be a positive number, got '0'"),
    (["--params", "-5"], "--params must be a positive number, got '-5'"),
    (["--params", "7X"], "--params: '7X' has an unknown suffix 'X'"),
    (["--params", "lots"], "--params: 'lots' is not a number"),
    (["--params", "1e9", "--nodes", "0"], "--nodes must be >= 1, got 0"),
    (["--params", "1e9", "--gpus", "-2"], "--gpus must be >= 0, got -2"),
    (["--params", "1e9", "--gpus", "0"], "--gpus must be >= 1 for --phase iteration"),
    (["--params", "1e9", "--batch", "0"], "--batch must be a positive number"),
    (["--params", "1e9", "--nvme-read-bw", "-1"], "--nvme-read-bw must be a positive number"),
    (["--params", "1e9", "--paramz", "3"], "unknown option '--paramz'"),
])
def test_bad_options_are_named(args, message):
    argv = ["plan", *args]
    if "--gpus" not in args:
        argv += ["--gpus", "8"]
    assert message in error_of(run(*argv))


def test_missing_measurement_is_named_with_how_to_measure_it():
    err = error_of(run(*STEP, "--nvme-read-bw", "1G", "--nvme-write-bw", "1G"))
    assert "NotFound: missing measurement: adam_params_per_s (" in err
    assert "strata bench adam --json" in err
    err = error_of(run("plan", "--params", "1e9", "--gpus", "8", "--adam-params-per-s", "1G"))
    for key in ("nvme_read_bytes_per_s", "nvme_write_bytes_per_s", "pcie_bytes_per_s",
                "allgather_bytes_per_s"):
        assert key in err


def test_malformed_config_and_bench_json_are_named(tmp_path):
    bad = write(tmp_path, "bad.json", '{"measured": {"nvme_read_bytes_per_s": ')
    # the configuration file goes through the shared parser (store/config.hpp), as with
    # every other command's --config
    err = error_of(run(*STEP, "--config", bad))
    assert f"config file '{bad}'" in err and "line 1, column 40" in err, err
    typo = write(tmp_path, "typo.json", {"measured": {"nvme_read_bw": 1e9}})
    err = error_of(run(*STEP, "--config", typo))
    assert f"config file '{typo}': unknown key 'measured.nvme_read_bw'" in err, err
    neg = write(tmp_path, "neg.json", {"measured": {"adam_params_per_s": 0}})
    assert "'measured.adam_params_per_s' must be a positive number, got 0" in error_of(
        run(*STEP, "--config", neg))
    ioerr = write(tmp_path, "io.json", {"io": {"queue_dpeth": 8}})
    assert "unknown key 'io.queue_dpeth' (did you mean 'io.queue_depth'?)" in error_of(
        run(*STEP, "--config", ioerr))
    missing = str(tmp_path / "absent.json")
    assert "absent.json" in error_of(run(*STEP, "--config", missing))
    other = write(tmp_path, "other.json", {"hello": "world"})
    assert f"{other}: not the --json result of a strata bench command" in error_of(
        run(*STEP, "--from-bench", other))
    short = write(tmp_path, "short.json", {"op": "read"})
    assert f"{short}: field 'gbps' is missing" in error_of(run(*STEP, "--from-bench", short))
    trunc = write(tmp_path, "trunc.json", '{"op": "read", "gbps"')
    assert f"{trunc}: not valid JSON" in error_of(run(*STEP, "--from-bench", trunc))


def test_a_number_too_large_for_a_double_is_an_error_not_an_abort(tmp_path):
    # nlohmann::json throws out_of_range (not parse_error) for 1e400.
    huge = write(tmp_path, "huge.json", '{"op": "read", "gbps": 1e400}')
    p = run(*STEP, "--from-bench", huge)
    assert p.returncode == 1 and f"{huge}: not valid JSON" in error_of(p), p.stderr
