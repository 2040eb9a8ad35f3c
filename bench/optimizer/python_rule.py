#!/usr/bin/python3
"""A Python update rule (strata.PythonRule: Adam written with torch ops on each streamed
slice) against the built-in C++ Adam, on the same state (fp32 master + 2 moments) in the
nvme tier, and against the pipeline's I/O alone.

Three strata.OffloadedOptimizer over one store each (under --path), each holding --tensors
tensors of --params / --tensors fp32 elements in the nvme tier, stepped with the same fp32
gradients:

- python_rule: Adam in torch ops (torch.from_numpy views of the slices: exp_avg.mul_().add_(),
  exp_avg_sq.mul_().addcmul_(), param.addcdiv_(), as torch.optim.Adam's single-tensor step);
- builtin_adam: strata's C++ SIMD Adam (optimizer="adam");
- io_bound: a PythonRule whose update does nothing: the step's reads and writes of the same
  3 streams with nothing to compute -- the limit both steps meet.

Their steps alternate (builtin, python, io) for --iters rounds after --warmup untimed ones, so
machine noise hits all three. The rule's torch ops run on --torch-threads intra-op threads
(default: one per CPU, as strata's kernel pool for the built-in rule). Reported (medians, seconds): python_rule_step_seconds,
builtin_adam_step_seconds, io_bound_seconds, and python_over_builtin (the issue's goal: at
most 1.5), with the parameters, sub-group size, calls per step and the thread counts.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/python_rule.py --json \
        --params 100000000
"""
import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import strata


def adam_rule(calls):
    """Adam (torch.optim.Adam's single-tensor arithmetic) as a strata.PythonRule."""
    def update(param, grad, states, step, hp, ctx):
        calls[0] += 1
        p, g = torch.from_numpy(param), torch.from_numpy(grad)
        m, v = torch.from_numpy(states[0]), torch.from_numpy(states[1])
        b1, b2, lr, eps = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / bc1)
    return strata.PythonRule("torch_adam", update, ("exp_avg", "exp_avg_sq"), (),
                             dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8))


def noop_rule():
    return strata.PythonRule("noop", lambda *a: None, ("exp_avg", "exp_avg_sq"),
                             defaults=dict(lr=1e-3))


def make(path, params, tensors, chunk, rule=None):
    store = strata.Store.open(path, host_budget="64MiB", staging="64MiB", chunk_size=chunk)
    kw = dict(rule=rule) if rule is not None else dict(optimizer="adam")
    opt = strata.OffloadedOptimizer.create(store, hyperparams={"lr": 1e-3}, **kw)
    n = params // tensors
    init = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    hs = [opt.add_param(f"w{i}", n, init, placement="nvme") for i in range(tensors)]
    return store, opt, hs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=2_000_000, help="parameters (default 2M)")
    ap.add_argument("--tensors", type=int, default=10)
    ap.add_argument("--chunk", default="4MiB", help="store chunk = sub-group bytes per stream")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--path", default=None, help="directory of the stores (default: a temp dir)")
    ap.add_argument("--torch-threads", type=int, default=os.cpu_count(),
                    help="torch intra-op threads of the Python rule (default: one per CPU, as "
                         "strata's kernel pool)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.torch_threads)
    root = a.path or tempfile.mkdtemp(prefix="python-rule-bench-")
    os.makedirs(root, exist_ok=True)
    calls = [0]
    runs = {}
    try:
        for name, rule in (("builtin_adam", None), ("python_rule", adam_rule(calls)),
                           ("io_bound", noop_rule())):
            runs[name] = make(os.path.join(root, name), a.params, a.tensors, a.chunk, rule)
        n = a.params // a.tensors
        grads = [np.random.default_rng(1 + i).standard_normal(n, dtype=np.float32) * 1e-2
                 for i in range(a.tensors)]
        for _, opt, hs in runs.values():
            for h, g in zip(hs, grads):
                opt.set_grad(h, g)
        times = {k: [] for k in runs}
        for it in range(a.warmup + a.iters):
            calls[0] = 0
            for name, (_, opt, _) in runs.items():
                t0 = time.perf_counter()
                opt.step(skip_if_nonfinite=False)
                if it >= a.warmup:
                    times[name].append(time.perf_counter() - t0)
        calls_per_step = calls[0]
        sub_group = runs["python_rule"][1].sub_group_numel()
        p_py = runs["python_rule"][1].read_param(runs["python_rule"][2][0], count=1000)
        p_c = runs["builtin_adam"][1].read_param(runs["builtin_adam"][2][0], count=1000)
        max_diff = float(np.abs(p_py - p_c).max())
    finally:
        for store, opt, _ in runs.values():
            opt.close(checkpoint=False)
            store.close()
        if a.path is None:
            shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = dict(params=a.params, tensors=a.tensors, sub_group_numel=sub_group,
               python_calls_per_step=calls_per_step, iters=a.iters,
               torch_threads=torch.get_num_threads(), cpus=os.cpu_count(),
               python_rule_step_seconds=med["python_rule"],
               builtin_adam_step_seconds=med["builtin_adam"],
               io_bound_seconds=med["io_bound"],
               python_over_builtin=med["python_rule"] / med["builtin_adam"],
               goal_python_over_builtin=1.5,
               max_abs_diff_python_vs_builtin=max_diff,
               samples={k: v for k, v in times.items()})
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
