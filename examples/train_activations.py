#!/usr/bin/python3
"""Activation offload (strata.torch.offload_activations): trains a model whose saved
activations are several times the memory the training process may use, and checks it
against torch in memory.

The model is a stack of residual MLP blocks (d -> 4d -> d, SiLU) over a batch of --tokens
rows: what autograd saves for backward (each block's input, the 4d-wide pre- and
post-SiLU tensors) grows with tokens x blocks while the parameters stay small. Three runs,
each in its own process, from the same seed on the same batches, with AdamW:

  1. offloaded, under a memory cgroup of --memory-limit bytes that this script creates
     (examples/memory_limit.py; root): saved activations in a host pool of --host-budget
     bytes, spilled beyond it to a strata store under --dir (nvme tier), prefetched in
     backward along the previous step's order;
  2. the same training in memory, without the limit (the reference);
  3. the in-memory training under the same limit: killed for memory, which shows the
     limit is real (skip with --no-oom-demo).

It prints the saved activations' size over the limit, each run's per-step loss and time,
the cgroup's peak charge, and the offload's counters. The last line is ``OK`` only when
runs 1 and 2 agree bit for bit (every step's loss, every final parameter's bytes), the
activations were at least 4x the limit, and run 3 was killed; ``FAIL: ...`` otherwise
(exit status 1). ``--quick`` is the short form scripts/test.sh runs (through the test
suite): fewer steps and blocks, the same checks.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_activations.py
    ... --quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FULL = dict(blocks=42, d_model=16, tokens=65536, steps=3, memory_limit="368MiB",
            host_budget="32MiB")
QUICK = dict(blocks=48, d_model=16, tokens=49152, steps=2, memory_limit="320MiB",
             host_budget="32MiB")


def build(args):
    import torch
    torch.manual_seed(args.seed)
    d = args.d_model
    layers = [torch.nn.Linear(16, d)]
    for _ in range(args.blocks):
        layers.append(Block(d))
    layers.append(torch.nn.Linear(d, 8))
    return torch.nn.Sequential(*layers)


def _block_class():
    import torch
    import torch.nn.functional as F

    class _Block(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = torch.nn.Linear(d, 4 * d)
            self.down = torch.nn.Linear(4 * d, d)

        def forward(self, h):
            return h + self.down(F.silu(self.up(h)))
    return _Block


def Block(d):  # noqa: N802 (a class made after torch's import, in the child only)
    return _block_class()(d)


def batch(args, step):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(args.tokens, 16, generator=g),
            torch.randint(0, 8, (args.tokens,), generator=g))


def train_step(model, opt, act, x, y):
    """One AdamW step on (x, y): the forward inside ``act`` (an ActivationOffload, or None
    for torch in memory), then backward and step. Returns the loss (a 0-d tensor)."""
    import torch.nn.functional as F
    if act is not None:
        with act:
            loss = F.cross_entropy(model(x), y)
    else:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def activation_bytes(args) -> int:
    """Bytes autograd saves per step (fp32): the first linear's input, per block its input
    (up's), up's output (SiLU's input), SiLU's output (down's input), the head's input and
    the cross-entropy's log-softmax."""
    n, d = args.tokens, args.d_model
    return 4 * n * (16 + d + args.blocks * (d + 8 * d) + 8)


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def run_child(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    model = build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    act = None
    if args.role == "offload":
        import strata.torch as st
        act = st.offload_activations(path=args.dir, host_budget_bytes=args.host_budget,
                                     min_bytes="64KiB", prefetch="32MiB",
                                     write_window_bytes="32MiB")
    losses, seconds = [], []
    for step in range(args.steps):
        x, y = batch(args, step)
        t0 = time.perf_counter()
        loss = train_step(model, opt, act, x, y)
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del x, y, loss
        print(f"  [{args.role}] step {step + 1}/{args.steps}: loss {losses[-1]:.6f}, "
              f"{seconds[-1]:.2f} s", flush=True)
    result = dict(losses=losses, seconds=seconds,
                  digests={n: digest(p) for n, p in model.named_parameters()})
    if act is not None:
        result["stats"] = act.stats()
        act.close()
    with open(args.result, "w") as f:
        json.dump(result, f)


def child_argv(args, role: str, result: str):
    argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--result", result]
    for k in ("blocks", "d_model", "tokens", "steps", "seed", "threads", "host_budget",
              "dir"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the short form (tests)")
    for k in ("blocks", "d_model", "tokens", "steps"):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--memory-limit", default=None)
    ap.add_argument("--host-budget", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dir", default=None, help="store directory (default: a temporary one)")
    ap.add_argument("--no-oom-demo", action="store_true")
    ap.add_argument("--role", choices=["offload", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for k, v in (QUICK if args.quick else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.role:
        run_child(args)
        return 0
    import strata
    from memory_limit import MemoryLimitUnavailable, compare_runs
    limit = strata.parse_size(args.memory_limit)
    saved = activation_bytes(args)
    work = tempfile.mkdtemp(prefix="strata-activations-")
    own_dir = args.dir is None
    if own_dir:
        args.dir = os.path.join(work, "store")
    env = dict(os.environ)
    print(f"model: {args.blocks} blocks, d_model {args.d_model}, {args.tokens} tokens per "
          f"batch; saved activations {mib(saved)} per step = {saved / limit:.2f} x the "
          f"{mib(limit)} memory limit; host pool {args.host_budget}")
    try:
        try:
            runs, failures = compare_runs(lambda role, res: child_argv(args, role, res),
                                          limit, work, oom_demo=not args.no_oom_demo,
                                          env=env)
        except MemoryLimitUnavailable as e:
            print(f"FAIL: no memory cgroup: {e}")
            return 1
        if len(runs) == 2:
            a, b = runs["offload"], runs["torch"]
            s = a["stats"]
            print("offload stats: " + ", ".join(
                f"{k} {s[k]:.3f}" if isinstance(s[k], float) else f"{k} {s[k]}"
                for k in ("activation_bytes", "bytes_spilled", "bytes_written",
                          "pool_peak_bytes", "prefetch_hits", "prefetch_misses",
                          "stall_seconds", "fetch_seconds")))
            per_step = s["activation_bytes"] / args.steps
            print(f"activations offloaded per step: {mib(per_step)} = "
                  f"{per_step / limit:.2f} x the limit")
            if per_step < 4 * limit:
                failures.append(f"activations per step {mib(per_step)} < 4 x the limit")
            if a["losses"] != b["losses"]:
                failures.append(f"losses differ: {a['losses']} vs {b['losses']}")
            diff = [n for n in b["digests"] if a["digests"].get(n) != b["digests"][n]]
            if diff:
                failures.append(f"{len(diff)} parameters differ, e.g. {diff[0]}")
            else:
                print(f"losses and all {len(b['digests'])} parameters bit-identical")
            ratio = (sorted(a["seconds"])[len(a["seconds"]) // 2]
                     / sorted(b["seconds"])[len(b["seconds"]) // 2])
            print(f"offloaded / in-memory step time: {ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
