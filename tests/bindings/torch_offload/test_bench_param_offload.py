"""bench/optimizer/param_offload.py on the tiny preset: one JSON object with every field,
of sane types and values, the byte accounting exact, the three children's losses equal, and
nothing left under --path (not a timing test); its flags passed through or refused by
name."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "optimizer",
                     "param_offload.py")

FLOATS = ("fetch_seconds", "stall_seconds", "stall_fraction", "offloaded_iteration_seconds",
          "in_memory_iteration_seconds", "resident_iteration_seconds", "offloaded_ratio",
          "resident_ratio", "throughput_ratio", "first_iteration_seconds",
          "offloaded_forward_backward_seconds", "offloaded_optimizer_seconds",
          "in_memory_forward_backward_seconds", "in_memory_optimizer_seconds",
          "resident_forward_backward_seconds", "resident_optimizer_seconds",
          "drive_read_gbps", "drive_write_gbps", "io_bound_seconds", "io_bound_ratio",
          "io_bound_over_in_memory", "io_bound_throughput_ratio", "bytes_read_per_param",
          "bytes_written_per_param", "max_grad_norm")
INTS = ("params", "param_bytes", "bytes_fetched", "prefetch_hits", "prefetch_misses",
        "steady_prefetch_misses", "steady_iterations", "resident_hits", "trace_mismatches",
        "grad_bytes_written", "grad_bytes_read", "optimizer_bytes_read",
        "optimizer_bytes_written", "param_bytes_written", "bytes_written_back",
        "bytes_read_per_iteration", "bytes_written_per_iteration",
        "bytes_moved_per_iteration", "peak_rss_bytes", "peak_rss_bytes_since_start",
        "in_memory_peak_rss_bytes", "in_memory_peak_rss_bytes_since_start",
        "resident_peak_rss_bytes", "resident_peak_rss_bytes_since_start",
        "working_set_bytes", "peak_working_set_bytes", "resident_working_set_bytes",
        "resident_peak_working_set_bytes", "resident_bytes_fetched",
        "resident_prefetch_misses", "steps_skipped", "offloaded_minor_faults",
        "in_memory_minor_faults", "resident_minor_faults")
TINY_PARAMS = 1612800  # examples/train_offload.py's tiny GPT


def run_tiny(tmp_path, *extra):
    return subprocess.run([sys.executable, BENCH, "--preset", "tiny", "--iters", "2",
                           "--warmup", "1", "--json", "--path", str(tmp_path), "--fio-size",
                           "32MiB", "--fio-seconds", "0.5", "--threads", "1", *extra],
                          capture_output=True, text=True, timeout=240)


def test_tiny_run_prints_every_field(tmp_path):
    p = run_tiny(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    out = json.loads(lines[0])
    for k in FLOATS:
        assert type(out[k]) is float and out[k] >= 0, (k, out.get(k))
    for k in INTS:
        assert type(out[k]) is int and out[k] >= 0, (k, out.get(k))
    assert out["overlap_backward"] is False and out["max_grad_norm"] == 1.0
    # release_memory=None: a 6.45 MB model in a machine with GBs free fixes nothing
    assert out["release_memory"] is None
    assert out["mmap_threshold_fixed"] is False and out["resident_mmap_threshold_fixed"] is False
    assert out["params"] == TINY_PARAMS and out["param_bytes"] == 4 * TINY_PARAMS
    assert out["working_set_bytes"] == 2 << 20
    assert 0 < out["peak_working_set_bytes"] <= out["working_set_bytes"]
    # one iteration's I/O: every parameter fetched at least once (forward), each weight
    # stored once (4 B), each gradient written and read once, the step's fp32 masters and
    # two moments read and written once (12 B)
    assert out["bytes_fetched"] >= 4 * TINY_PARAMS
    assert out["param_bytes_written"] == 4 * TINY_PARAMS
    assert out["grad_bytes_written"] == out["grad_bytes_read"] == 4 * TINY_PARAMS
    assert out["optimizer_bytes_read"] == out["optimizer_bytes_written"] == 12 * TINY_PARAMS
    assert out["bytes_written_back"] == 0
    assert out["bytes_read_per_iteration"] == (out["bytes_fetched"] + out["grad_bytes_read"]
                                               + out["optimizer_bytes_read"])
    assert out["bytes_written_per_iteration"] == 20 * TINY_PARAMS
    assert out["bytes_moved_per_iteration"] == (out["bytes_read_per_iteration"]
                                                + out["bytes_written_per_iteration"])
    assert out["bytes_read_per_param"] == out["bytes_read_per_iteration"] / TINY_PARAMS > 0
    assert out["bytes_written_per_param"] == 20.0
    assert out["prefetch_hits"] + out["prefetch_misses"] > 0
    assert out["steady_iterations"] == 2  # warm-up 1 (the first of all: not steady) + 2
    assert out["drive_read_gbps"] > 0 and out["drive_write_gbps"] > 0
    assert len(out["drive_read_gbps_runs"]) == len(out["drive_write_gbps_runs"]) == 2
    assert out["io_bound_seconds"] == pytest.approx(
        out["bytes_read_per_iteration"] / (out["drive_read_gbps"] * 1e9)
        + out["bytes_written_per_iteration"] / (out["drive_write_gbps"] * 1e9))
    assert out["io_bound_ratio"] == out["offloaded_iteration_seconds"] / out[
        "io_bound_seconds"]
    assert out["peak_rss_reset"] is True and out["children_ok"] is True
    assert out["peak_rss_bytes"] <= out["peak_rss_bytes_since_start"]
    assert out["offloaded_ratio"] == out["offloaded_iteration_seconds"] / out[
        "in_memory_iteration_seconds"]
    assert out["resident_ratio"] == out["resident_iteration_seconds"] / out[
        "in_memory_iteration_seconds"]
    assert out["throughput_ratio"] == out["in_memory_iteration_seconds"] / out[
        "offloaded_iteration_seconds"]
    assert out["stall_fraction"] == (out["stall_seconds"] / out["fetch_seconds"]
                                     if out["fetch_seconds"] > 0 else 0.0)
    # the resident run: twice the parameter bytes, rounded up to a MiB, holds them all
    assert out["resident_working_set_bytes"] == 13 << 20
    assert 0 < out["resident_peak_working_set_bytes"] <= out["resident_working_set_bytes"]
    assert out["steps_skipped"] == 0
    # same model, seed and batches: the same losses, up to the simd arithmetic's ulps in
    # the warm-up's step
    for k in ("losses_offloaded", "losses_resident"):
        assert len(out[k]) == len(out["losses_in_memory"]) == 2
        assert out[k] == pytest.approx(out["losses_in_memory"], rel=1e-4)
    assert os.listdir(tmp_path) == []  # stores and fio file removed


def test_overlap_backward_is_passed_to_the_optimizer(tmp_path):
    """--overlap-backward builds the offloaded runs' OffloadAdamW with overlap_backward=True
    (here without clipping, --max-grad-norm 0): the update inside backward, 12 bytes per
    parameter written (master and moments), no gradient stored, no parameter stored apart
    from its master. --release-memory true: both offloaded children fix glibc's mmap
    threshold."""
    p = run_tiny(tmp_path, "--overlap-backward", "--max-grad-norm", "0",
                 "--release-memory", "true")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["overlap_backward"] is True and out["max_grad_norm"] == 0.0
    assert out["release_memory"] is True
    assert out["mmap_threshold_fixed"] is True and out["resident_mmap_threshold_fixed"] is True
    assert type(out["steady_prefetch_misses"]) is int
    assert out["grad_bytes_written"] == out["grad_bytes_read"] == out["param_bytes_written"] == 0
    assert out["optimizer_bytes_written"] == 12 * TINY_PARAMS
    assert out["bytes_written_per_param"] == 12.0
    assert out["bytes_read_per_param"] >= 12.0  # fetches (>= 4) + moments (8)
    for k in ("losses_offloaded", "losses_resident"):
        assert out[k] == pytest.approx(out["losses_in_memory"], rel=1e-4)
    assert os.listdir(tmp_path) == []


def test_bad_preset_is_named():
    p = subprocess.run([sys.executable, BENCH, "--preset", "huge"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--preset: one of" in p.stderr and "'huge'" in p.stderr, \
        p.stderr


@pytest.mark.parametrize("args,message", [
    (["--max-grad-norm", "-1"], "--max-grad-norm: must be >= 0"),
    (["--resident-working-set", "0"], "must be > 0 bytes"),
    (["--release-memory", "maybe"], "--release-memory: invalid choice: 'maybe'"),
])
def test_bad_arguments_are_named(args, message):
    p = subprocess.run([sys.executable, BENCH, "--preset", "tiny", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr
