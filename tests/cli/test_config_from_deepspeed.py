"""`strata config from-deepspeed`: the configurations of DeepSpeed's and Hugging Face's
documentation (tests/cli/data/deepspeed, see its README) give exactly the strata file and
report expected key by key; an existing file is updated, not replaced; bad input fails with
a message naming the file and key, and writes nothing."""
import json
import os
import subprocess

import pytest

STRATA = os.environ.get("STRATA_CLI", "strata")
DATA = os.path.join(os.path.dirname(__file__), "data", "deepspeed")


def run(*args, check=True):
    e = dict(os.environ)
    e.pop("STRATA_CONFIG", None)
    p = subprocess.run([STRATA, *map(str, args)], capture_output=True, text=True, timeout=60,
                       env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


def convert(name, out, *extra):
    p = run("config", "from-deepspeed", os.path.join(DATA, name), "--output", out, "--json",
            *extra)
    return json.loads(p.stdout)


def outcomes(report):
    return {k["deepspeed"]: (k["outcome"], k.get("strata"), k.get("strata_value"))
            for k in report["keys"]}


def test_hugging_face_zero3_nvme(tmp_path):
    out = tmp_path / "strata.json"
    r = convert("hf_zero3_nvme.json", out)
    written = json.loads(out.read_text())
    assert written == {
        "strata_config": 1,
        "io": {"queue_depth": 32, "block_size": 262144, "submit_batch": 0},
        "store": {"nvme_dirs": ["/local_nvme"]},
        "optimizer": {"default_placement": "nvme"},
    }
    assert r["config"] == written and r["output"] == str(out) and not r["updated_existing"]
    z, o, p, a = ("zero_optimization", "zero_optimization.offload_optimizer",
                  "zero_optimization.offload_param", "zero_optimization.aio")
    assert outcomes(r) == {
        f"{z}.stage": ("in code", None, None),
        f"{o}.device": ("set", "optimizer.default_placement", "nvme"),
        f"{o}.nvme_path": ("set", "store.nvme_dirs", "/local_nvme"),
        f"{o}.pin_memory": ("kept", None, None),
        f"{o}.buffer_count": ("not honoured", None, None),
        f"{o}.fast_init": ("kept", None, None),
        f"{p}.device": ("in code", None, None),
        f"{p}.nvme_path": ("set", "store.nvme_dirs", "/local_nvme"),
        f"{p}.pin_memory": ("kept", None, None),
        f"{p}.buffer_count": ("in code", None, None),
        f"{p}.buffer_size": ("in code", None, None),
        f"{p}.max_in_cpu": ("not honoured", None, None),
        f"{p}.buffer_count*buffer_size": ("in code", None, None),
        a: ("kept", None, None),
        f"{a}.block_size": ("set", "io.block_size", 262144),
        f"{a}.queue_depth": ("set", "io.queue_depth", 32),
        f"{a}.thread_count": ("not honoured", None, None),
        f"{a}.single_submit": ("set", "io.submit_batch", 0),
        f"{a}.overlap_events": ("kept", None, None),
        f"{z}.overlap_comm": ("not read", None, None),
        f"{z}.contiguous_gradients": ("not read", None, None),
        f"{z}.sub_group_size": ("not honoured", None, None),
        f"{z}.reduce_bucket_size": ("kept", None, None),
        f"{z}.stage3_prefetch_bucket_size": ("kept", None, None),
        f"{z}.stage3_param_persistence_threshold": ("kept", None, None),
        f"{z}.stage3_max_live_parameters": ("not honoured", None, None),
        f"{z}.stage3_max_reuse_distance": ("not honoured", None, None),
        f"{z}.stage3_gather_16bit_weights_on_model_save": ("kept", None, None),
    }
    # The keys come in the file's order; the reasons say why.
    assert [k["deepspeed"] for k in r["keys"]][:3] == [
        f"{z}.stage", f"{o}.device", f"{o}.nvme_path"]
    why = {k["deepspeed"]: k["why"] for k in r["keys"]}
    assert "PR 7056" in why[f"{a}.thread_count"]
    assert "working_set=1000000000" in why[f"{p}.buffer_count*buffer_size"]
    assert 'tier="nvme"' in why[f"{p}.device"]
    assert why[f"{z}.sub_group_size"].startswith(
        "strata's 4 pipeline slots would pin 44.70 GiB (48 bytes per element for Adam)")
    # strata reads the file it wrote.
    info = run("info", "--config", out, "--json").stdout
    assert "262144" in info


def test_hugging_face_zero3_cpu_and_training_keys(tmp_path):
    out = tmp_path / "s.json"
    r = convert("hf_zero3_cpu.json", out)
    assert json.loads(out.read_text()) == {
        "strata_config": 1,
        "optimizer": {"default_placement": "host"},
    }
    got = outcomes(r)
    for top in ("fp16", "optimizer", "scheduler", "gradient_accumulation_steps",
                "gradient_clipping", "steps_per_print", "train_batch_size",
                "train_micro_batch_size_per_gpu", "wall_clock_breakdown"):
        assert got[top] == ("not read", None, None), top
    assert got["zero_optimization.offload_param.device"] == ("in code", None, None)
    assert 'tier="host"' in {k["deepspeed"]: k["why"] for k in r["keys"]}[
        "zero_optimization.offload_param.device"]


def test_deepspeed_reference_two_paths_ratio_and_top_level_aio(tmp_path):
    out = tmp_path / "s.json"
    r = convert("deepspeed_zero_infinity.json", out)
    assert json.loads(out.read_text()) == {
        "strata_config": 1,
        "io": {"queue_depth": 8, "block_size": 1048576, "submit_batch": 0},
        "store": {"nvme_dirs": ["/local_nvme", "/local_nvme1"]},
        "optimizer": {"default_placement": "nvme"},
    }
    got = outcomes(r)
    assert got["zero_optimization.offload_optimizer.ratio"] == ("not honoured", None, None)
    assert got["zero_optimization.*.nvme_path"] == (
        "set", "store.nvme_dirs", ["/local_nvme", "/local_nvme1"])
    assert got["aio.queue_depth"] == ("set", "io.queue_depth", 8)
    assert got["zero_optimization.stage3_param_persistence_threshold"] == (
        "not honoured", None, None)
    assert got["zero_optimization.reduce_bucket_size"] == ("not read", None, None)


def test_sub_group_size_within_the_pinned_limit_is_set(tmp_path):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"zero_optimization": {"sub_group_size": 1e7}}))
    r = convert(src, tmp_path / "s.json")
    assert r["config"] == {"strata_config": 1, "optimizer": {"sub_group_numel": 10000000}}
    assert r["keys"][0]["why"] == (
        "elements per pipeline sub-group: 4 slots pin 457.76 MiB for Adam (48 bytes per element)")


def test_text_report_counts_and_dry_run(tmp_path):
    out = tmp_path / "s.json"
    p = run("config", "from-deepspeed", os.path.join(DATA, "hf_zero3_nvme.json"),
            "--output", out, "--dry-run")
    assert not out.exists()
    lines = p.stdout.splitlines()
    assert lines[0].endswith("-> (dry run: nothing written)")
    assert "  set           aio.queue_depth" not in p.stdout  # nested: zero_optimization.aio
    assert ("  set           zero_optimization.aio.queue_depth = 32 -> io.queue_depth = 32"
            in p.stdout)
    assert lines[-1] == "6 set, 9 kept, 5 in code, 6 not honoured, 2 not read"


def test_existing_file_is_updated_not_replaced(tmp_path):
    out = tmp_path / "s.json"
    out.write_text(json.dumps({"strata_config": 1, "io": {"queue_depth": 4, "workers": 2},
                               "measured": {"nvme_read_bytes_per_s": 2.5e9}}))
    r = convert("hf_zero3_cpu.json", out)
    assert r["updated_existing"]
    assert json.loads(out.read_text()) == {
        "strata_config": 1,
        "io": {"queue_depth": 4, "workers": 2},
        "optimizer": {"default_placement": "host"},
        "measured": {"nvme_read_bytes_per_s": 2.5e9},
    }


@pytest.mark.parametrize("ds,message", [
    ({"aio": {"queue_depth": 0}},
     "deepspeed config '{f}': aio.queue_depth = 0: io.queue_depth: expected an integer in "
     "1..4096, got 0"),
    ({"aio": {"queue_depth": "deep"}},
     "deepspeed config '{f}': aio.queue_depth: expected a non-negative integer, got \"deep\""),
    ({"aio": {"block_size": 1.5}},
     "deepspeed config '{f}': aio.block_size: expected a non-negative integer, got 1.5"),
    ({"aio": {"single_submit": "yes"}},
     "deepspeed config '{f}': aio.single_submit: expected true or false, got \"yes\""),
    ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}},
     "deepspeed config '{f}': zero_optimization.offload_optimizer.device: expected \"cpu\", "
     "\"nvme\" or \"none\", got \"gpu\""),
    ({"zero_optimization": {"offload_optimizer": {"ratio": 2}}},
     "deepspeed config '{f}': zero_optimization.offload_optimizer.ratio: expected a number "
     "in 0..1, got 2"),
    ({"zero_optimization": []},
     "deepspeed config '{f}': zero_optimization: expected an object, got []"),
    ([1, 2], "deepspeed config '{f}': (top level): expected an object, got [1,2]"),
])
def test_bad_values_name_the_file_and_key_and_write_nothing(tmp_path, ds, message):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps(ds))
    out = tmp_path / "s.json"
    p = run("config", "from-deepspeed", src, "--output", out, check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == "strata: error: InvalidArgument: " + message.format(f=src)
    assert not out.exists()


def test_unreadable_and_malformed_files(tmp_path):
    missing = tmp_path / "nope.json"
    p = run("config", "from-deepspeed", missing, "--output", tmp_path / "s.json", check=False)
    assert p.returncode == 1
    assert f"cannot open deepspeed config '{missing}'" in p.stderr
    assert "No such file or directory" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"aio": {"queue_depth": 8,}}')
    p = run("config", "from-deepspeed", bad, "--output", tmp_path / "s.json", check=False)
    assert p.returncode == 1
    assert f"deepspeed config '{bad}': not JSON:" in p.stderr
    assert "line 1, column 27" in p.stderr
    assert not (tmp_path / "s.json").exists()
