#!/usr/bin/python3
"""Runs the benchmarks behind docs/benchmarks.md and writes their JSON to docs/data/.

Usage: /usr/bin/python3 scripts/bench_docs_data.py {io,adam,step} [--dir DIR] [--reps K]
                                                    [--strata PATH] [--out DIR]

  io    `strata bench io --json` over block sizes x queue depths, read and write, --size each
        (default 512MiB), and fio (io_uring, O_DIRECT, same file, same shape) at queue depth 32
        as the limit; rounds alternate (K of them) -> io_sweep.json.
  adam  `strata bench adam --json --threads T` for T = 1 .. 2 x cores (default), K rounds
        alternating the thread counts -> adam_threads.json.
  step  `strata bench step --json` for a few (params, buffers) shapes, K rounds alternating
        the shapes -> step_breakdown.json.

Each file: {"command": ..., "machine": ..., "results": [the benchmark's JSON objects, each with
"round"], "limits": [...]} (the shape scripts/plot_bench.py reads). DIR (default
/var/tmp/strata-docs-bench) is removed afterwards. Errors: a failing benchmark stops the run
with its command and stderr.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    cores = os.cpu_count()
    load = os.getloadavg()
    return f"{cores} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end"


def run_json(cmd, whole=False):
    """The JSON that cmd prints: its last line (strata --json), or all of it (fio)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_docs_data.py: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout if whole else p.stdout.strip().splitlines()[-1])


def fio(path, op, bs, qd, size):
    cmd = ["fio", "--name=seq", f"--filename={path}", f"--rw={op}", f"--bs={bs}",
           f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1", f"--size={size}",
           "--invalidate=1", "--output-format=json"]
    return run_json(cmd, whole=True)["jobs"][0][op]["bw_bytes"] / 1e9


def sweep_io(a):
    sizes = {"64KiB": 65536, "256KiB": 262144, "1MiB": 1 << 20, "4MiB": 4 << 20}
    qds = [1, 4, 16, 32]
    base = [a.strata, "bench", "io", "--path", a.dir, "--size", a.size, "--keep", "--json"]
    run_json(base + ["--op", "write"])  # lay the file out once (untimed)
    path = os.path.join(a.dir, "strata-bench-io.dat")
    results, limits = [], []
    for r in range(a.reps):
        for op in ("read", "write"):
            for bs_name, bs in sizes.items():
                for qd in qds:
                    j = run_json(base + ["--op", op, "--block-size", str(bs), "--queue-depth", str(qd)])
                    j["round"] = r
                    results.append(j)
                gb = fio(path, op, bs_name.replace("iB", ""), 32, a.size.replace("iB", ""))
                limits.append({"tool": "fio", "op": op, "block_size": bs, "queue_depth": 32,
                               "gbps": gb, "round": r})
                print(f"round {r} {op} bs={bs_name}: strata qd32 {results[-1]['gbps']:.2f} "
                      f"fio {gb:.2f} GB/s", file=sys.stderr)
    return {"command": f"strata bench io --path DIR --size {a.size} --op read|write --block-size "
                       "B --queue-depth Q --json (B in 64KiB..4MiB, Q in 1..32); fio --rw=read|write "
                       "--ioengine=io_uring --direct=1 --iodepth=32 on the same file",
            "results": results, "limits": limits}


def sweep_adam(a):
    threads = list(range(1, 2 * os.cpu_count() + 1))
    results = []
    for r in range(a.reps):
        for t in threads:
            j = run_json([a.strata, "bench", "adam", "--numel", str(a.numel), "--threads", str(t),
                          "--steps", "10", "--json"])
            j["round"] = r
            results.append(j)
            print(f"round {r} threads {t}: {j['ns_per_param']:.2f} ns/param, "
                  f"{j['fraction_of_limit']:.2f} of the limit", file=sys.stderr)
    return {"command": f"strata bench adam --numel {a.numel} --threads T --steps 10 --json",
            "results": results}


def sweep_step(a):
    shapes = [(100_000_000, 4), (500_000_000, 4), (500_000_000, 2)]
    results = []
    for r in range(a.reps):
        for params, buffers in shapes:
            j = run_json([a.strata, "bench", "step", "--params", str(params), "--path", a.dir,
                          "--host-budget", "1GiB", "--buffers", str(buffers), "--steps", "3",
                          "--json"])
            j["round"] = r
            results.append(j)
            print(f"round {r} params {params} buffers {buffers}: step {j['step_seconds']:.2f} s, "
                  f"io {j['io_seconds']:.2f} s, compute {j['compute_seconds']:.2f} s, "
                  f"overlap {j['overlap_efficiency']:.3f}", file=sys.stderr)
    return {"command": "strata bench step --params N --path DIR --host-budget 1GiB --buffers B "
                       "--steps 3 --json",
            "results": results}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["io", "adam", "step"])
    ap.add_argument("--dir", default="/var/tmp/strata-docs-bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", default="512MiB", help="io: bytes per run")
    ap.add_argument("--numel", type=int, default=50_000_000, help="adam: parameters")
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "data"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    try:
        doc = {"io": sweep_io, "adam": sweep_adam, "step": sweep_step}[a.what](a)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    doc["machine"] = machine()
    name = {"io": "io_sweep", "adam": "adam_threads", "step": "step_breakdown"}[a.what]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.join(a.out, name + '.json')}")


if __name__ == "__main__":
    main()
