"""bench/optimizer/param_offload.py on the tiny preset: one JSON object with every field,
of sane types and values, the two children's losses equal, and nothing left under --path
(not a timing test)."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "optimizer",
                     "param_offload.py")

FLOATS = ("fetch_seconds", "stall_seconds", "stall_over_fetch", "offloaded_step_seconds",
          "in_memory_step_seconds", "throughput_ratio", "offloaded_forward_backward_seconds",
          "offloaded_optimizer_seconds", "in_memory_forward_backward_seconds",
          "in_memory_optimizer_seconds", "drive_read_gbps", "drive_write_gbps",
          "io_bound_seconds", "io_bound_over_in_memory", "io_bound_throughput_ratio",
          "offloaded_over_io_bound")
INTS = ("params", "bytes_fetched", "prefetch_hits", "prefetch_misses", "resident_hits",
        "trace_mismatches", "grad_bytes_written", "grad_bytes_read", "optimizer_bytes_read",
        "optimizer_bytes_written", "param_bytes_written", "bytes_written_back",
        "bytes_read_per_iteration", "bytes_written_per_iteration",
        "bytes_moved_per_iteration", "peak_rss_bytes", "peak_rss_bytes_since_start",
        "in_memory_peak_rss_bytes", "in_memory_peak_rss_bytes_since_start",
        "working_set_bytes", "peak_working_set_bytes", "steps_skipped")


def test_tiny_run_prints_every_field(tmp_path):
    p = subprocess.run([sys.executable, BENCH, "--preset", "tiny", "--iters", "2", "--warmup",
                        "1", "--json", "--path", str(tmp_path), "--fio-size", "32MiB",
                        "--fio-seconds", "0.5", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    out = json.loads(lines[0])
    for k in FLOATS:
        assert type(out[k]) is float and out[k] >= 0, (k, out.get(k))
    for k in INTS:
        assert type(out[k]) is int and out[k] >= 0, (k, out.get(k))
    tiny_params = 1612800  # examples/train_offload.py's tiny GPT
    assert out["params"] == tiny_params
    assert out["working_set_bytes"] == 2 << 20
    assert 0 < out["peak_working_set_bytes"] <= out["working_set_bytes"]
    # one iteration's I/O: every parameter fetched at least once (forward), each weight
    # stored once (4 B), each gradient written and read once, the step's Adam state
    assert out["bytes_fetched"] >= 4 * tiny_params
    assert out["param_bytes_written"] == 4 * tiny_params
    assert out["grad_bytes_written"] == out["grad_bytes_read"] == 4 * tiny_params
    assert out["optimizer_bytes_read"] > 0 and out["optimizer_bytes_written"] > 0
    assert out["bytes_moved_per_iteration"] == (out["bytes_read_per_iteration"]
                                                + out["bytes_written_per_iteration"])
    assert out["prefetch_hits"] + out["prefetch_misses"] > 0
    assert out["drive_read_gbps"] > 0 and out["drive_write_gbps"] > 0
    assert len(out["drive_read_gbps_runs"]) == len(out["drive_write_gbps_runs"]) == 2
    assert out["peak_rss_reset"] is True and out["children_ok"] is True
    assert out["peak_rss_bytes"] <= out["peak_rss_bytes_since_start"]
    assert out["throughput_ratio"] == out["in_memory_step_seconds"] / out[
        "offloaded_step_seconds"]
    assert out["steps_skipped"] == 0
    # same model, seed and batches: the same losses, up to the simd arithmetic's ulps in
    # the warm-up's step
    assert len(out["losses_offloaded"]) == len(out["losses_in_memory"]) == 2
    assert out["losses_offloaded"] == pytest.approx(out["losses_in_memory"], rel=1e-4)
    assert os.listdir(tmp_path) == []  # store and fio file removed


def test_bad_preset_is_named():
    p = subprocess.run([sys.executable, BENCH, "--preset", "huge"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--preset: one of" in p.stderr and "'huge'" in p.stderr, \
        p.stderr
