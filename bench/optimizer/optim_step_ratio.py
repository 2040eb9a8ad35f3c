#!/usr/bin/python3
"""Step time of strata.torch.OffloadAdamW against torch.optim.AdamW, over model sizes.

For each size (parameters, cut into --tensors tensors of near-equal size) and each tier,
two copies of the same model get the same fixed gradients; then strata's step and torch's
in-memory step alternate, one each per round (so machine noise hits both), after one
untimed warm-up step each. Reported: the median wall time of each side's steps, their
ratio (strata / torch), strata's own step statistic (``last_step["seconds"]``, the C++
step without the Python around it) and the NVMe bytes per step.

    /usr/bin/python3 bench/optimizer/optim_step_ratio.py                  # every size
    /usr/bin/python3 bench/optimizer/optim_step_ratio.py --sizes 1K,1M --tiers nvme --json

--json prints one JSON object per line per (size, tier). Sizes take K/M/G suffixes
(powers of 10). Needs PYTHONPATH with the strata module (e.g. build/python).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import strata.torch as st

_SUFFIX = {"K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text):
    """'100K' -> 100000 (K, M, G: powers of 10); ValueError naming the text."""
    t = text.strip().upper()
    mult = _SUFFIX.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in _SUFFIX else t
    if not digits.isdigit() or int(digits) == 0:
        raise ValueError(f"bad size {text!r} (e.g. 1000, 10K, 1M)")
    return int(digits) * mult


def default_steps(numel):
    """Timed steps per side: many for small models, few for 100M (each step moves 2.4 GB)."""
    if numel <= 10**6:
        return 50
    if numel <= 10**7:
        return 10
    return 3


def make_model(numel, tensors, seed):
    """`tensors` fp32 parameters of near-equal size summing to `numel`, and their
    gradients (fixed, from `seed`)."""
    base, extra = divmod(numel, tensors)
    sizes = [base + (1 if i < extra else 0) for i in range(tensors)]
    g = torch.Generator().manual_seed(seed)
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n, generator=g) * 0.02)
        p.grad = torch.randn(n, generator=g) * 1e-3
        params.append(p)
    return params


def clone_model(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(numel, tier, tensors, steps, base_dir):
    ours = make_model(numel, tensors, seed=numel)
    theirs = clone_model(ours)
    path = tempfile.mkdtemp(prefix="optim-ratio-", dir=base_dir)
    opt = None
    try:
        opt = st.OffloadAdamW(ours, lr=1e-3, path=os.path.join(path, "store"), tier=tier)
        ref = torch.optim.AdamW(theirs, lr=1e-3)
        opt.step()
        ref.step()
        t_ours, t_theirs, stat = [], [], []
        read0 = opt.bytes_moved["nvme_read"]
        for _ in range(steps):
            t_ours.append(timed(opt.step))
            stat.append(opt.last_step["seconds"])
            t_theirs.append(timed(ref.step))
        s, t = statistics.median(t_ours), statistics.median(t_theirs)
        return dict(numel=numel, tensors=tensors, tier=tier, steps=steps,
                    strata_step_ms=round(s * 1e3, 4), torch_step_ms=round(t * 1e3, 4),
                    ratio=round(s / t, 3),
                    strata_stat_ms=round(statistics.median(stat) * 1e3, 4),
                    nvme_read_bytes_per_step=(opt.bytes_moved["nvme_read"] - read0) // steps)
    finally:
        if opt is not None:
            opt.close()
        shutil.rmtree(path, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1K,10K,100K,1M,10M,100M",
                    help="comma-separated parameter counts (default %(default)s)")
    ap.add_argument("--tiers", default="host,nvme", help="comma-separated: host, nvme")
    ap.add_argument("--tensors", type=int, default=10, help="tensors per model (default 10)")
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per side (default: 50 up to 1M, 10 up to 10M, else 3)")
    ap.add_argument("--dir", default=os.environ.get("STRATA_DIR", "/var/tmp/strata"),
                    help="where the temporary stores go (default $STRATA_DIR or /var/tmp/strata)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    a = ap.parse_args()
    try:
        sizes = [parse_size(x) for x in a.sizes.split(",") if x.strip()]
    except ValueError as e:
        ap.error(str(e))
    tiers = [x.strip() for x in a.tiers.split(",") if x.strip()]
    for t in tiers:
        if t not in ("host", "nvme"):
            ap.error(f"unknown tier {t!r} (host, nvme)")
    if a.tensors < 1:
        ap.error("--tensors must be >= 1")
    os.makedirs(a.dir, exist_ok=True)
    if not a.json:
        print(f"{'params':>10} {'tier':>5} {'steps':>5} {'strata ms':>10} {'torch ms':>10} "
              f"{'ratio':>7} {'C++ stat ms':>11}")
    for n in sizes:
        for tier in tiers:
            row = measure(n, tier, min(a.tensors, n), a.steps or default_steps(n), a.dir)
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{row['numel']:>10} {tier:>5} {row['steps']:>5} "
                      f"{row['strata_step_ms']:>10.3f} {row['torch_step_ms']:>10.3f} "
                      f"{row['ratio']:>7.2f} {row['strata_stat_ms']:>11.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
