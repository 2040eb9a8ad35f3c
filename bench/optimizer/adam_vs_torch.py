#!/usr/bin/python3
"""strata's CPU Adam step against torch.optim.Adam, measured alternately in one run.

Each round runs `strata bench adam --json` (which itself reports the memory-bandwidth limit
of an Adam-shaped streaming kernel, measured alternately with the kernel) and then the same
number of torch.optim.Adam steps (torch.set_num_threads(threads), fp32, default
single-tensor implementation) on the same number of parameters. Rounds alternate so that
machine noise hits both; the report gives medians over all steps of all rounds.

    /usr/bin/python3 bench/optimizer/adam_vs_torch.py --strata build/strata \
        --numel 100000000 --threads 2 --rounds 3 --steps 5
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def torch_steps(params, steps):
    """Per-step seconds of `steps` Adam steps (gradients already set)."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params["opt"].step()
        out.append(time.perf_counter() - t0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--strata", default="build/strata", help="path of the strata CLI")
    ap.add_argument("--numel", type=int, default=100_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round and side")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.rand(args.numel, generator=gen) - 0.5)
    p.grad = (torch.rand(args.numel, generator=gen) - 0.5) * 0.01
    opt = torch.optim.Adam([p], lr=1e-3)
    state = {"opt": opt}
    torch_steps(state, 2)  # warm-up: allocates exp_avg / exp_avg_sq

    strata_s, limit_s, fractions, torch_s = [], [], [], []
    for r in range(args.rounds):
        cmd = [args.strata, "bench", "adam", "--numel", str(args.numel), "--threads",
               str(args.threads), "--steps", str(args.steps), "--json"]
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        strata_s += res["seconds_per_step_all"]
        limit_s += res["mem_limit_seconds_all"]
        fractions.append(res["fraction_of_limit"])
        torch_s += torch_steps(state, args.steps)
        print(f"round {r + 1}/{args.rounds}: strata {res['seconds_per_step'] * 1e3:.1f} ms/step "
              f"(fraction_of_limit {res['fraction_of_limit']:.3f}), torch "
              f"{statistics.median(torch_s[-args.steps:]) * 1e3:.1f} ms/step", file=sys.stderr)

    bytes_moved = 28 * args.numel
    s_med, t_med, l_med = (statistics.median(strata_s), statistics.median(torch_s),
                           statistics.median(limit_s))
    report = {
        "numel": args.numel,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "strata_seconds_per_step": s_med,
        "torch_seconds_per_step": t_med,
        "speedup_vs_torch": t_med / s_med,
        "strata_gbps": bytes_moved / s_med / 1e9,
        "torch_gbps": bytes_moved / t_med / 1e9,
        "mem_limit_gbps": bytes_moved / l_med / 1e9,
        "fraction_of_limit_median": statistics.median(fractions),
        "fraction_of_limit_pooled": l_med / s_med,
        "torch_version": torch.__version__,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")


if __name__ == "__main__":
    main()
