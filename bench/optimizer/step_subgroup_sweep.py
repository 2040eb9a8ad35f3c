#!/usr/bin/python3
"""The offloaded step's time over pipeline sub-group sizes, as ratios to the one-chunk step.

Runs ``strata bench step --params P --chunk-size C --sub-group N --buffers 0 --host-budget H
--steps K --json`` for N = each of --chunks (multiples of the store chunk C / 4 elements;
default 1/4 to 16 chunks), --rounds times. The sizes run ascending in odd rounds and
descending in even ones, so a drift of the machine's speed over the run does not favour
one end. ``--buffers 0`` gives each size as many pinned slots as the budget holds (4..64),
a sub-group below 4 MiB sharing its slot with the next ones of its tensor.

Per size (seconds, medians): ``median_of_run_medians_s`` (each run's figure is the median
of its K steps, as ``strata bench step`` reports it), ``median_of_all_steps_s`` (all K x
rounds steps), and ``ratio_to_one_chunk``: the median over rounds of this size's run over
the one-chunk run of the same round (a paired ratio: both ran within a minute of each
other). ``max_ratio`` is the largest ``ratio_to_one_chunk``; ``within_10_percent`` says
whether every size is within 10% of the one-chunk step (issue 25's goal). Each run's JSON
is kept in ``results`` with its round and the 1-minute load average before it.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/step_subgroup_sweep.py \\
        --strata build/strata \\
        --path /var/tmp/sweep --rounds 6 --json > docs/data/step_subgroup_sweep.json

Needs --path on the disk to measure (each size keeps its own store under it; removed at
the end unless --keep). Errors: a failed ``strata bench step`` stops the sweep with its
exit status and stderr.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from fractions import Fraction

import strata


def run_one(args, sub_group, path):
    cmd = [args.strata, "bench", "step", "--params", str(args.params), "--chunk-size",
           args.chunk_size, "--sub-group", str(sub_group), "--buffers", "0", "--path", path,
           "--host-budget", args.host_budget, "--steps", str(args.steps), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"step_subgroup_sweep: {' '.join(cmd)} exited {p.returncode}: {p.stderr}")
    return json.loads(p.stdout)


def summarize(chunks, rounds_runs, one):
    """Per size: medians and the paired ratio to the one-chunk run (`one`) of each round."""
    summary = []
    for c in chunks:
        runs = [r[c] for r in rounds_runs]
        steps = [s for r in runs for s in r["step_seconds_all"]]
        ratios = [r[c]["step_seconds"] / r[one]["step_seconds"] for r in rounds_runs]
        summary.append({
            "chunks": float(c),
            "sub_group_numel": runs[0]["sub_group_numel"],
            "buffers": runs[0]["buffers"],
            "median_of_run_medians_s": statistics.median(r["step_seconds"] for r in runs),
            "median_of_all_steps_s": statistics.median(steps),
            "ratio_to_one_chunk": statistics.median(ratios),
            "ratios_per_round": ratios,
        })
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default="build/strata", help="the strata CLI")
    ap.add_argument("--path", required=True, help="directory for the stores (one per size)")
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--chunk-size", default="4MiB", help="the store chunk C")
    ap.add_argument("--chunks", default="1/4,1/2,1,2,4,8,16",
                    help="sub-group sizes in chunks (fractions allowed); must include 1")
    ap.add_argument("--host-budget", default="1GiB")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the stores under --path")
    ap.add_argument("--json", action="store_true", help="print the JSON document")
    args = ap.parse_args()
    chunks = [Fraction(c) for c in args.chunks.split(",")]
    if Fraction(1) not in chunks:
        ap.error("--chunks must include 1 (the reference size)")
    chunk_numel = strata.parse_size(args.chunk_size) // 4
    sizes = {}
    for c in chunks:
        n = c * chunk_numel
        if n.denominator != 1 or n < 1:
            ap.error(f"--chunks {c}: {c} x {chunk_numel} elements is not a whole number >= 1")
        sizes[c] = int(n)
    results, rounds_runs = [], []
    for r in range(args.rounds):
        order = chunks if r % 2 == 0 else list(reversed(chunks))
        runs = {}
        for c in order:
            load = os.getloadavg()[0]
            d = run_one(args, sizes[c], os.path.join(args.path, f"sg{sizes[c]}"))
            d.update({"round": r, "chunks": float(c), "load_average_1min": load})
            runs[c] = d
            results.append(d)
            if not args.json:
                print(f"round {r} {float(c):g} chunks: step {d['step_seconds']:.3f} s "
                      f"({d['buffers']} slots, load {load:.2f})", file=sys.stderr)
        rounds_runs.append(runs)
    if not args.keep:
        shutil.rmtree(args.path, ignore_errors=True)
    summary = summarize(chunks, rounds_runs, Fraction(1))
    max_ratio = max(s["ratio_to_one_chunk"] for s in summary)
    doc = {
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "params": args.params, "chunk_bytes": strata.parse_size(args.chunk_size),
        "rounds": args.rounds, "steps": args.steps,
        "summary": summary, "max_ratio": max_ratio, "within_10_percent": max_ratio <= 1.10,
        "results": results,
    }
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        for s in summary:
            print(f"{s['chunks']:g} chunks ({s['sub_group_numel']} elements, {s['buffers']} "
                  f"slots): {s['median_of_run_medians_s']:.3f} s, "
                  f"{s['ratio_to_one_chunk']:.3f} x one chunk")
        print(f"max ratio {max_ratio:.3f}: " +
              ("within" if max_ratio <= 1.10 else "outside") + " 10%")


if __name__ == "__main__":
    main()
