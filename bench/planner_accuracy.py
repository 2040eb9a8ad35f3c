#!/usr/bin/python3
"""Planner accuracy: `strata plan`'s predictions against measurements on this machine.

For every configuration it measures the planner's inputs and the thing predicted in one run,
alternately (ROUNDS times), and compares the plan made from the inputs' medians with the
measurement's median:

  step   `strata bench step` (offloaded Adam step, states on NVMe) for several sizes, kernel
         threads and sub-group sizes, against `strata plan --phase optimizer --offload
         optimizer --gpus 0` from `bench io --op read|write` (NVMe read and write
         bandwidth) and `bench adam` (CPU Adam params/s at the same thread count). A second
         prediction uses the step's own I/O-alone and compute-alone probes (--from-bench of
         the step JSON: nvme_mixed_bytes_per_s and adam_params_per_s), which isolates the
         planner's pipeline model from the reads/writes mix model.
  fetch  `strata bench partitioned-read --nproc N` for N = 1, 2, 4 against `strata plan
         --phase fetch --ranks-per-node N --gpus 0` from `bench io --op read` and `bench
         allgather --nproc N` (its memcpy probe for N = 1, where the gather is a local
         copy); the plan without --overlap (this 2-core machine does not overlap the
         reads with the all-gather: docs/planner.md); with --emulated-drive-bw B (when the command has it) each rank
         reads its own emulated drive and the plan gets --drive-bw B.

Writes docs/data/planner_accuracy.json (or --out) and prints the table docs/planner.md
shows. Usage:
  /usr/bin/python3 bench/planner_accuracy.py --path /var/tmp/plan-acc [--strata build/strata]
      [--rounds 3] [--only step|fetch] [--emulated-drive-bw 200MB]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (params, kernel threads, sub-group elements; 0 = one 64 MiB chunk = 16,777,216)
STEP_CONFIGS = [
    (100_000_000, 0, 0),
    (100_000_000, 1, 4_194_304),
    (50_000_000, 2, 8_388_608),
]
FETCH_BYTES = 256 << 20


def run_json(strata, *args, timeout=1800):
    cmd = [strata, *map(str, args), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:  # progress lines before a one-line object
        return json.loads(p.stdout.strip().splitlines()[-1])


def save(tmp, name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def median_of(results, key):
    return statistics.median(r[key] for r in results)


def store_inputs(strata, path):
    """The store's put/get bandwidth (`bench store`: checksums and chunks included, the path
    the optimizer step and the fetch take), as {"read": gbps, "write": gbps}."""
    j = run_json(strata, "bench", "store", "--path", os.path.join(path, "store-bw"),
                 "--object-size", "256MiB", "--count", 4, "--rounds", 2)
    return {"read": {"gbps": j["get_gbps"]}, "write": {"gbps": j["put_gbps"]}, "raw": j}


def io_inputs(strata, path, size, ops=("write", "read")):
    out = {}
    for op in ops:
        # Writes go to a fresh file (the store's copy-on-write chunks go to fresh extents);
        # the read file is kept (laid out once).
        keep = ["--keep"] if op == "read" else []
        out[op] = run_json(strata, "bench", "io", "--path", path, "--size", size, "--op", op,
                           "--file-name", f"planner-acc-{op}.dat", *keep)
    return out


def plan(strata, *args):
    return run_json(strata, "plan", *args)


def step_rows(a, tmp):
    rows = []
    for params, threads, sub_group in STEP_CONFIGS:
        io_r, adam_r, step_r = [], [], []
        for k in range(a.rounds):
            io_r.append(store_inputs(a.strata, a.path) if a.inputs == "store"
                        else io_inputs(a.strata, a.path, "1GiB"))
            adam_r.append(run_json(a.strata, "bench", "adam", "--numel", min(params, 50_000_000),
                                   "--threads", threads, "--steps", 5))
            step_r.append(run_json(a.strata, "bench", "step", "--params", params, "--path",
                                   a.path, "--threads", threads, "--sub-group", sub_group,
                                   "--steps", 3))
            print(f"  step {params} t{threads} sg{sub_group} round {k + 1}: "
                  f"step {step_r[-1]['step_seconds']:.3f} s", file=sys.stderr)
        read = statistics.median(x["read"]["gbps"] for x in io_r) * 1e9
        write = statistics.median(x["write"]["gbps"] for x in io_r) * 1e9
        adam = statistics.median(x["numel"] / x["seconds_per_step"] for x in adam_r)
        measured = median_of(step_r, "step_seconds")
        sg = step_r[0]["sub_group_numel"]
        common = ["--params", params, "--gpus", 0, "--nodes", 1, "--phase", "optimizer",
                  "--offload", "optimizer", "--sub-group", sg,
                  "--chunk-bytes", step_r[0]["chunk_bytes"]]
        p = plan(a.strata, *common, "--nvme-read-bw", read, "--nvme-write-bw", write,
                 "--adam-params-per-s", adam)
        # The step's own probes, through --from-bench (the median run by step time).
        mid = sorted(step_r, key=lambda r: r["step_seconds"])[len(step_r) // 2]
        q = plan(a.strata, *common, "--from-bench", save(tmp, f"step-{params}-{threads}.json", mid))
        rows.append({
            "kind": "step",
            "label": f"step, {params / 1e6:.0f}M params, threads {threads}, sub-group "
                     f"{sg / 2**20:.0f} Mi",
            "config": f"bench step --params {params} --threads {threads} --sub-group {sg}",
            "params": params, "threads": threads, "sub_group_numel": sg,
            "inputs": {"nvme_read_bytes_per_s": read, "nvme_write_bytes_per_s": write,
                       "adam_params_per_s": adam},
            "predicted_seconds": p["predicted_step_seconds"],
            "predicted_bottleneck": p["bottleneck"],
            "predicted_from_step_probes_seconds": q["predicted_step_seconds"],
            "measured_seconds": measured,
            "measured_seconds_all": [r["step_seconds"] for r in step_r],
            "measured_io_seconds": median_of(step_r, "io_seconds"),
            "measured_compute_seconds": median_of(step_r, "compute_seconds"),
            "ratio": p["predicted_step_seconds"] / measured,
            "ratio_from_step_probes": q["predicted_step_seconds"] / measured,
        })
    return rows


def has_emulation(strata):
    p = subprocess.run([strata, "bench", "partitioned-read", "--help"], capture_output=True,
                       text=True)
    return "--emulated-drive-bw" in p.stdout


def fetch_rows(a, tmp):
    rows = []
    emulated = a.emulated_drive_bw is not None
    if emulated and not has_emulation(a.strata):
        raise SystemExit("--emulated-drive-bw: this strata has no `bench partitioned-read "
                         "--emulated-drive-bw` yet")
    for n in (1, 2, 4):
        read_r, gather_r, part_r = [], [], []
        for k in range(a.rounds):
            read_r.append(store_inputs(a.strata, a.path)["read"] if a.inputs == "store"
                          else io_inputs(a.strata, a.path, "1GiB", ops=("read",))["read"])
            gather_r.append(run_json(a.strata, "bench", "allgather", "--nproc", n,
                                     "--bytes", FETCH_BYTES, "--iters", 5))
            args = ["bench", "partitioned-read", "--nproc", n, "--bytes", FETCH_BYTES,
                    "--path", os.path.join(a.path, f"part{n}"), "--iters", 5]
            if emulated:
                args += ["--emulated-drive-bw", a.emulated_drive_bw]
            part_r.append(run_json(a.strata, *args))
            print(f"  fetch N={n} round {k + 1}: {part_r[-1]['seconds']:.3f} s", file=sys.stderr)
        read = statistics.median(x["gbps"] for x in read_r) * 1e9
        args = ["--params", FETCH_BYTES // 2, "--gpus", 0, "--nodes", 1, "--ranks-per-node", n,
                "--phase", "fetch", "--nvme-read-bw", read,
                "--piece-bytes", part_r[0]["piece_bytes"]]
        inputs = {"nvme_read_bytes_per_s": read}
        if n > 1:
            busbw = statistics.median(x["busbw_gbps"] for x in gather_r) * 1e9
            args += ["--allgather-bw", busbw]
            inputs["allgather_bytes_per_s"] = busbw
        else:  # one rank: the gather is a local copy (bench allgather's memcpy probe)
            copy = statistics.median(x["memcpy_gbps"] for x in gather_r) * 1e9
            args += ["--memory-bw", copy]
            inputs["memory_copy_bytes_per_s"] = copy
        if emulated:  # the drives' configured throttle B (bytes/s), not what they delivered
            args += ["--drive-bw", part_r[0]["emulated_drive_bw"]]
            inputs["drive_read_bytes_per_s"] = part_r[0]["emulated_drive_bw"]
        p = plan(a.strata, *args)
        measured = median_of(part_r, "seconds")
        # The read phase alone: the plan's time on the drive (or NVMe) link against the
        # bench's read_seconds (every rank reading its slice, slowest rank), which is what
        # grows with the number of drives; the fetch above adds the all-gather.
        fetch_phase = next(ph for ph in p["phases"] if ph["phase"] == "parameter_fetch")
        read_tier = next(t for t in fetch_phase["tiers"] if t["tier"] in ("drive", "nvme"))
        read_measured = median_of(part_r, "read_seconds")
        where = "emulated drives" if emulated else "one disk"
        rows.append({
            "kind": "read", "label": f"read phase, N = {n}, {where}",
            "config": f"read phase of bench partitioned-read --nproc {n} --bytes {FETCH_BYTES}"
                      + (f" --emulated-drive-bw {a.emulated_drive_bw}" if emulated else ""),
            "nproc": n, "inputs": inputs,
            "predicted_seconds": read_tier["seconds"],
            "predicted_bottleneck": read_tier["tier"],
            "measured_seconds": read_measured,
            "measured_seconds_all": [r["read_seconds"] for r in part_r],
            "ratio": read_tier["seconds"] / read_measured,
        })
        rows.append({
            "kind": "fetch", "label": f"partitioned fetch, N = {n}, {where}",
            "config": f"bench partitioned-read --nproc {n} --bytes {FETCH_BYTES}"
                      + (f" --emulated-drive-bw {a.emulated_drive_bw}" if emulated else ""),
            "nproc": n, "inputs": inputs,
            "predicted_seconds": p["predicted_step_seconds"],
            "predicted_bottleneck": p["bottleneck"],
            "measured_seconds": measured,
            "measured_seconds_all": [r["seconds"] for r in part_r],
            "measured_aggregate_gbps": statistics.median(
                r.get("aggregate_gbps", r["gbps"]) for r in part_r),
            "ratio": p["predicted_step_seconds"] / measured,
        })
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path", required=True, help="a directory on the drive to measure")
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["step", "fetch"])
    ap.add_argument("--inputs", choices=["store", "io"], default="store",
                    help="NVMe rates from `bench store` (the store's data path, default) or "
                    "`bench io` (the raw engine, what `strata tune` measures)")
    ap.add_argument("--emulated-drive-bw", help="B per emulated drive, as `bench partitioned-read "
                    "--emulated-drive-bw` takes it (root only)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "data", "planner_accuracy.json"))
    a = ap.parse_args()
    os.makedirs(a.path, exist_ok=True)
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if a.only in (None, "step"):
            rows += step_rows(a, tmp)
        if a.only in (None, "fetch"):
            rows += fetch_rows(a, tmp)
    out = {"benchmark": "planner_accuracy", "rounds": a.rounds, "path": a.path,
           "nvme_inputs": a.inputs,
           "load_average": os.getloadavg(), "nproc": os.cpu_count(),
           "wall_seconds": time.time() - t0, "results": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("| config | predicted s | measured s | ratio | bottleneck |")
    print("|---|---|---|---|---|")
    for r in rows:
        extra = (f" (step probes: {r['predicted_from_step_probes_seconds']:.3f}, "
                 f"x{r['ratio_from_step_probes']:.2f})" if r["kind"] == "step" else "")
        print(f"| `{r['config']}` | {r['predicted_seconds']:.3f}{extra} | "
              f"{r['measured_seconds']:.3f} | {r['ratio']:.2f} | {r['predicted_bottleneck']} |")


if __name__ == "__main__":
    main()
