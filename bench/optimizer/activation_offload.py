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
     (release_memory=True, the default: glibc's mmap threshold fixed at 128 KiB, see
     offload_activations).

Same allocator in every child (--malloc pinned, the default): each child starts with
MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=64 GiB in its environment. With
glibc's dynamic thresholds (--malloc default) whether the heap's free top is trimmed after
an iteration depends on what happens to lie above it, so some iterations of a child (M as
often as H) paged the activations in again (135k-220k minor faults, 1-2 s of system time
under load) and others did not, at random per process: that and the load, not the
offload, made single runs' H/M range from 0.74 to 2.14 (docs/activations.md). S's
release_memory=True then sets its own 128 KiB threshold.

One iteration = forward + backward + step + zero_grad, timed in the child (wall seconds,
the child's CPU seconds, its minor page faults). Each child runs --warmup untimed
iterations, then --iters rounds: M and H back to back (which goes first alternates), then
S (--no-spill: no S; its figures are null). Figures are medians over the rounds; ``host_pool.paired_ratio`` is the median of the
rounds' H/M wall-time ratios (M and H measured seconds apart, under the same load: the
figure to read on a shared machine), ``offloaded_ratio`` the ratio of medians. Per
iteration of H and S, from ActivationOffload.stats(): activation bytes, bytes spilled,
stall and fetch seconds. Peak RSS is each child's VmHWM since its start.

``--json`` prints one object: ``activation_bytes``, ``activation_bytes_spilled``,
``activation_stall_seconds``, ``activation_fetch_seconds``, ``stall_over_fetch``,
``iteration_seconds_offloaded`` (S), ``iteration_seconds_in_memory`` (M),
``offloaded_ratio`` (S / M), ``peak_rss_bytes`` (S) and ``peak_rss_bytes_in_memory``,
``cpu_seconds`` / ``minor_faults`` (S; ``..._in_memory``: M; per iteration, medians);
``host_pool`` holds the same figures of H (``iteration_seconds_offloaded``, its ratio,
``paired_ratio``, its peak RSS); ``config`` the arguments, ``malloc`` (the variables set)
and ``loadavg`` (/proc/loadavg's 1-minute figure at the start and the end). Everything
under --path is removed on exit.

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

#: the allocator every child gets with --malloc pinned: 16 MiB activations come from the
#: heap (below the mmap threshold) and the heap's top is never trimmed, so after the
#: warm-up no child pages its activations in again
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def child(args) -> None:
    import resource
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
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        loss = ex.train_step(model, opt, act, x, y)
        dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        out = {"seconds": dt, "loss": loss.item(),
               "cpu_seconds": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
               "minor_faults": r1.ru_minflt - r0.ru_minflt}
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
    ap.add_argument("--iters", type=int, default=9, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-spill", action="store_true",
                    help="M and H only (many rounds quickly; the spilled figures are null)")
    ap.add_argument("--malloc", choices=["pinned", "default"], default="pinned",
                    help="the children's glibc allocator (see the module doc)")
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
    names = ("memory", "host") if args.no_spill else ("memory", "host", "spill")
    procs = {}
    env = dict(os.environ)
    for k in PINNED_MALLOC:
        env.pop(k, None)
    if args.malloc == "pinned":
        env.update(PINNED_MALLOC)
    load0 = _loadavg()
    try:
        for n in names:
            argv = [sys.executable, os.path.abspath(__file__), "--child", n]
            for k in ("blocks", "d_model", "tokens", "host_budget", "threads", "seed", "path"):
                argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            procs[n] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        runs = {n: [] for n in names}
        for i in range(args.warmup + args.iters):
            # M and H back to back (alternating which goes first), then S: a pair's two
            # turns see the same load, and S's I/O follows each of them equally often
            order = ("memory", "host", "spill") if i % 2 == 0 else ("host", "memory", "spill")
            for n in order[:len(names)]:
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
    if any(losses[n] != losses["memory"] for n in names):
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
                "peak_rss_bytes": peaks[n], "cpu_seconds": med(n, "cpu_seconds"),
                "minor_faults": int(med(n, "minor_faults"))}
    out = figures("spill") if "spill" in names else dict.fromkeys(figures("host"))
    host = figures("host")
    host["paired_ratio"] = statistics.median(
        h["seconds"] / m["seconds"] for h, m in zip(runs["host"], runs["memory"]))
    out.update(iteration_seconds_in_memory=med("memory", "seconds"),
               peak_rss_bytes_in_memory=peaks["memory"],
               cpu_seconds_in_memory=med("memory", "cpu_seconds"),
               minor_faults_in_memory=int(med("memory", "minor_faults")), host_pool=host,
               config={"blocks": args.blocks, "d_model": args.d_model, "tokens": args.tokens,
                       "host_budget": args.host_budget, "iters": args.iters,
                       "warmup": args.warmup, "threads": args.threads,
                       "no_spill": args.no_spill,
                       "malloc": {k: env[k] for k in PINNED_MALLOC if k in env}},
               loadavg=[load0, _loadavg()])
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
