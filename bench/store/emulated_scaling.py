#!/usr/bin/python3
"""Scaling over emulated drives (one per rank): the measurements behind
docs/data/emulated_scaling.json and the table in docs/partitioned.md.

For each N in --nproc (default 1 2 4), alternating in one session:

  real_disk          `strata bench partitioned-read --nproc N` with every rank's store on the
                     real disk (--path), unthrottled: the reference (all ranks share one disk);
  partitioned_read   the same with --emulated-drive-bw B: rank r's store on its own emulated
                     drive of B bytes/s (the parameter fetch: read_* is each rank reading its
                     slice, gbps/pipelined_* is fetch_partitioned, read + all-gather);
  offloaded_step     `strata emulate-drives --count N --bw B -- strata launch --nproc N --
                     strata bench step --params P/N --path <drive r>`: each rank runs the
                     offloaded Adam step over its own partition (P/N parameters, ZeRO's
                     partitioned optimizer state) on its own drive. The ranks start together
                     and run independently; aggregate_params_per_s = P / the slowest rank's
                     median step_seconds;
  param_fetch        the same wrapper around `strata launch --nproc N -- python3
                     bench/optimizer/param_fetch_ranks.py`: ZeRO-3 parameter offload
                     (strata.torch.offload_parameters with a Communicator), every forward
                     fetching all --fetch-params parameters, each rank its slices from its
                     own drive, then all-gather; fetch_gbps = params x 4 B / forward time.

Raw JSON of every run is kept; "results" has one row per N (what scripts/plot_bench.py
charts). Needs root (loop devices, mount, blkio cgroup): elsewhere the strata commands fail with "emulated drives refused".

    /usr/bin/python3 bench/store/emulated_scaling.py --strata build/strata --path /var/tmp/x \\
        --out docs/data/emulated_scaling.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def run_json(cmd: list[str]) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def step_ranks(strata: str, n: int, bw: str, path: str, params: int, steps: int) -> list[dict]:
    """Runs the offloaded step on n ranks, one emulated drive each; returns each rank's JSON."""
    inner = (f'd=$(echo "$STRATA_EMULATED_DRIVES" | cut -d: -f$((RANK+1))); '
             f'exec {strata} bench step --params {params // n} --steps {steps} '
             f'--host-budget 1GiB --path "$d/step" --json')
    cmd = [strata, "emulate-drives", "--count", str(n), "--bw", bw, "--size", "2GiB", "--path",
           path, "--", strata, "launch", "--nproc", str(n), "--", "sh", "-c", inner]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    ranks = {}
    for line in p.stdout.splitlines():
        if line.startswith("[rank ") and "{" in line:
            r = int(line[6:line.index("]")])
            ranks[r] = json.loads(line[line.index("{"):])
    if sorted(ranks) != list(range(n)):
        raise RuntimeError(f"not every rank printed its JSON:\n{p.stdout}\n{p.stderr}")
    return [ranks[r] for r in range(n)]


def param_fetch(strata: str, n: int, bw: str, path: str, params: int, iters: int) -> dict:
    """Runs bench/optimizer/param_fetch_ranks.py on n ranks, one emulated drive each."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optimizer",
                          "param_fetch_ranks.py")
    cmd = [strata, "emulate-drives", "--count", str(n), "--bw", bw, "--size", "1GiB", "--path",
           path, "--", strata, "launch", "--nproc", str(n), "--", sys.executable,
           os.path.abspath(script), "--params", str(params), "--iters", str(iters)]
    env = dict(os.environ)  # the strata module built beside the binary (build/python)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(strata), "python") + \
        (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    for line in p.stdout.splitlines():
        if line.startswith("[rank 0] {"):
            return json.loads(line[len("[rank 0] "):])
    raise RuntimeError(f"rank 0 printed no JSON:\n{p.stdout}\n{p.stderr}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--path", default=None, help="directory on the real disk (default: a new "
                    "one under /var/tmp, removed afterwards)")
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--bw", default="150MiB", help="per-drive throttle (default 150MiB = "
                    "157286400 bytes/s)")
    ap.add_argument("--bytes", default="512MiB", help="partitioned-read object size S")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--step-params", type=int, default=16_000_000,
                    help="offloaded step: total parameters P (each rank P/N)")
    ap.add_argument("--step-steps", type=int, default=3)
    ap.add_argument("--fetch-params", type=int, default=32 * 2**20,
                    help="parameter fetch: parameters in all (fp32)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    a = ap.parse_args()
    strata = os.path.abspath(a.strata)
    base = a.path or tempfile.mkdtemp(prefix="strata-emulated-scaling-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)
    out: dict = {"bench": "emulated_scaling", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
                 "host": platform.node(), "cpus": os.cpu_count(), "path": base,
                 "emulated_drive_bw_text": a.bw, "bytes_text": a.bytes, "iters": a.iters,
                 "step_params": a.step_params, "real_disk": [], "partitioned_read": [],
                 "offloaded_step": [], "param_fetch": [], "results": []}
    try:
        for n in a.nproc:
            common = [strata, "bench", "partitioned-read", "--nproc", str(n), "--bytes", a.bytes,
                      "--iters", str(a.iters), "--json"]
            real = run_json(common + ["--path", os.path.join(base, "real")])
            emul = run_json(common + ["--path", base, "--emulated-drive-bw", a.bw])
            steps = step_ranks(strata, n, a.bw, base, a.step_params, a.step_steps)
            fetch = param_fetch(strata, n, a.bw, base, a.fetch_params, a.iters)
            out["param_fetch"].append(fetch)
            out["real_disk"].append(real)
            out["partitioned_read"].append(emul)
            slowest = max(s["step_seconds"] for s in steps)
            step = {"nproc": n, "params": a.step_params, "params_per_rank": a.step_params // n,
                    "step_seconds_max": slowest,
                    "aggregate_params_per_s": a.step_params // n * n / slowest,
                    "ranks": steps}
            out["offloaded_step"].append(step)
            out["emulated_drive_bw"] = emul["emulated_drive_bw"]
            out["results"].append({
                "nproc": n,
                "target_gbps": emul["aggregate_target_gbps"],
                "aggregate_gbps": emul["aggregate_gbps"],
                "aggregate_efficiency": emul["aggregate_efficiency"],
                "per_drive_gbps": emul["per_drive_gbps"],
                "fetch_gbps": emul["gbps"],
                "allgather_algbw_gbps": emul["allgather_algbw_gbps"],
                "real_disk_read_gbps": real["read_gbps"],
                "step_seconds_max": slowest,
                "step_aggregate_params_per_s": step["aggregate_params_per_s"],
                "param_fetch_gbps": fetch["fetch_gbps"],
                "param_fetch_seconds": fetch["forward_seconds"],
            })
            print(json.dumps(out["results"][-1]), file=sys.stderr)
    finally:
        if a.path is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            shutil.rmtree(os.path.join(base, "real"), ignore_errors=True)
    base1 = out["results"][0]
    for row in out["results"]:
        row["aggregate_speedup"] = row["aggregate_gbps"] / base1["aggregate_gbps"]
        row["step_speedup"] = row["step_aggregate_params_per_s"] / \
            base1["step_aggregate_params_per_s"]
        row["param_fetch_speedup"] = row["param_fetch_gbps"] / base1["param_fetch_gbps"]
    text = json.dumps(out, indent=1) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
