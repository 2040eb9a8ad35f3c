#!/usr/bin/python3
"""Activation offload (strata.torch.offload_activations) against the same training with
the saved activations in memory, on examples/train_activations.py's model (residual MLP
blocks over --tokens rows; AdamW).

Three child processes (this script with a hidden --child flag, driven one iteration per
command over stdin/stdout pipes) train it from the same seed on the same batches:

  M. in memory (plain torch);
  H. offloaded, host pool only (a budget that holds every saved activation: nothing is
     spilled, so what it costs over M is the hooks' own work; release_memory=False: glibc's
     allocator as in M);
  S. offloaded, spilled: a host pool of --host-budget bytes, the rest to a strata store
     under --path (nvme tier), prefetched along the previous iteration's order
     (release_memory=True, the default: glibc's mmap threshold fixed, see
     offload_activations).

One iteration = forward + backward + step + zero_grad, timed in the child. Each child runs
--warmup untimed iterations, then the three take turns, one iteration each, --iters times
(the first of each turn rotating); figures are medians over those iterations. Per
iteration of H and S, from ActivationOffload.stats(): activation bytes, bytes spilled,
stall and fetch seconds. Peak RSS is each child's VmHWM since its start.

``--json`` prints one object: ``activation_bytes``, ``activation_bytes_spilled``,
``activation_stall_seconds``, ``activation_fetch_seconds``, ``stall_over_fetch``,
``iteration_seconds_offloaded`` (S), ``iteration_seconds_in_memory`` (M),
``offloaded_ratio`` (S / M), ``peak_rss_bytes`` (S) and ``peak_rss_bytes_in_memory``;
``host_pool`` holds the same figures of H (``iteration_seconds_offloaded``, its ratio,
its peak RSS). Everything under --path is removed on exit.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/activation_offload.py --json
    ... --tokens 4096 --blocks 4 --iters 2 --warmup 1 --json     # quick run (the test's)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def child(args) -> None:
    import torch
    import train_activations as ex
    torch.set_num_threads(args.threads)
    model = ex.build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    act = None
    if args.child != "memory":
        import strata.torch as st
        budget = "64GiB" if args.child == "host" else args.host_budget
        act = st.offload_activations(path=os.path.join(args.path, args.child),
                                     host_budget_bytes=budget, min_bytes="64KiB",
                                     release_memory=args.child == "spill")
    step = 0
    for line in sys.stdin:
        if line.strip() != "step":
            break
        x, y = ex.batch(args, step)
        step += 1
        if act is not None:
            act.reset_stats()
        t0 = time.perf_counter()
        loss = ex.train_step(model, opt, act, x, y)
        out = {"seconds": time.perf_counter() - t0, "loss": loss.item()}
        if act is not None:
            out.update(act.stats())
        del x, y, loss
        print(json.dumps(out), flush=True)
    print(json.dumps({"peak_rss_bytes": _vm_hwm()}), flush=True)
    if act is not None:
        act.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--host-budget", default="64MiB", help="the spilled run's host pool")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", default=None, help="store directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=["memory", "host", "spill"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    made = args.path is None
    args.path = args.path or tempfile.mkdtemp(prefix="strata-bench-activations-")
    os.makedirs(args.path, exist_ok=True)
    names = ("memory", "host", "spill")
    procs = {}
    try:
        for n in names:
            argv = [sys.executable, os.path.abspath(__file__), "--child", n]
            for k in ("blocks", "d_model", "tokens", "host_budget", "threads", "seed", "path"):
                argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            procs[n] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        runs = {n: [] for n in names}
        for i in range(args.warmup + args.iters):
            order = names[i % 3:] + names[:i % 3]
            for n in order:
                p = procs[n]
                p.stdin.write("step\n")
                p.stdin.flush()
                r = json.loads(p.stdout.readline())
                if i >= args.warmup:
                    runs[n].append(r)
        peaks = {}
        for n, p in procs.items():
            p.stdin.write("quit\n")
            p.stdin.flush()
            peaks[n] = json.loads(p.stdout.readline())["peak_rss_bytes"]
            p.wait()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        if made:
            shutil.rmtree(args.path, ignore_errors=True)
        else:
            for n in names:
                shutil.rmtree(os.path.join(args.path, n), ignore_errors=True)
    losses = {n: [r["loss"] for r in runs[n]] for n in names}
    if not (losses["memory"] == losses["host"] == losses["spill"]):
        print(f"bench: the runs' losses differ: {losses}", file=sys.stderr)
        return 1

    def med(n, k):
        return statistics.median(r[k] for r in runs[n])

    def figures(n):
        stall, fetch = med(n, "stall_seconds"), med(n, "fetch_seconds")
        return {"activation_bytes": int(med(n, "activation_bytes")),
                "activation_bytes_spilled": int(med(n, "bytes_spilled")),
                "activation_stall_seconds": stall, "activation_fetch_seconds": fetch,
                "stall_over_fetch": stall / fetch if fetch else 0.0,
                "prefetch_hits": int(med(n, "prefetch_hits")),
                "prefetch_misses": int(med(n, "prefetch_misses")),
                "iteration_seconds_offloaded": med(n, "seconds"),
                "offloaded_ratio": med(n, "seconds") / med("memory", "seconds"),
                "peak_rss_bytes": peaks[n]}
    out = figures("spill")
    out.update(iteration_seconds_in_memory=med("memory", "seconds"),
               peak_rss_bytes_in_memory=peaks["memory"], host_pool=figures("host"),
               config={"blocks": args.blocks, "d_model": args.d_model, "tokens": args.tokens,
                       "host_budget": args.host_budget, "iters": args.iters,
                       "warmup": args.warmup})
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
