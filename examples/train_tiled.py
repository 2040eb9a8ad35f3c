#!/usr/bin/python3
"""Tiling (strata.torch.offload_parameters(tile_bytes=...)): trains a model whose largest
parameter -- an embedding table -- is larger than the memory the training process may use
and several times the working set, and checks it against torch in memory.

The model: ``nn.Embedding(--vocab, --d-model)`` (the tiled parameter, --vocab x --d-model
fp32), the mean of each sequence's rows, ``Linear(d, d)``, tanh, ``Linear(d, 16)``: a
classifier over bags of ids, as recommendation and retrieval models are built. Three runs,
each in its own process, from the same seed on the same batches, with AdamW:

  1. offloaded, under a memory cgroup of --memory-limit bytes that this script creates
     (examples/memory_limit.py; root): the model built inside ``offload_init`` (each
     parameter stored as it is registered; the embedding built with ``device="meta"``, so
     its table is made in the store and initialized by ``normal_`` block by block, never
     allocated), a working set of --working-set bytes, the embedding tiled in
     blocks of --tile-bytes (the forward reads only its ids' rows, its gradient written
     block by block, stepped by OffloadAdamW from the store): the table is never whole in
     memory;
  2. the same training in memory, without the limit (the reference);
  3. the in-memory training under the same limit: killed for memory, which shows the
     limit is real (skip with --no-oom-demo).

It prints the table's size over the limit and the working set, each run's per-step loss
and time, the cgroup's peak charge and the offload's counters. The last line is ``OK`` only
when runs 1 and 2 agree bit for bit (every step's loss, every final parameter's bytes; the
embedding's operator and gradient are exact on blocks: docs/offload.md, "Tiling"), the
state_dict keys are the model's own, the table is larger than the limit and at least 4x the
working set, and run 3 was killed; ``FAIL: ...`` otherwise (exit status 1). ``--quick`` is
the short form scripts/test.sh runs (through the test suite).

    PYTHONPATH=build/python /usr/bin/python3 examples/train_tiled.py
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

FULL = dict(vocab=131072, d_model=1024, steps=3, memory_limit="320MiB",
            working_set="64MiB", tile_bytes="16MiB")
QUICK = dict(vocab=81920, d_model=1024, steps=2, memory_limit="256MiB",
             working_set="32MiB", tile_bytes="8MiB")
CLASSES, BATCH, SEQ = 16, 64, 64


def build(args, meta: bool = False):
    """The model (seeded); ``meta``: the embedding built on the meta device (inside
    offload_init: its parameter is made in the store, never allocated)."""
    import torch

    class Bags(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(args.vocab, args.d_model,
                                          device="meta" if meta else None)
            self.fc = torch.nn.Linear(args.d_model, args.d_model)
            self.out = torch.nn.Linear(args.d_model, CLASSES)

        def forward(self, idx):
            return self.out(torch.tanh(self.fc(self.emb(idx).mean(1))))

    torch.manual_seed(args.seed)
    return Bags()


def batch(args, step):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    # ids skewed towards the front of the table (frequent items), every block touched
    idx = (torch.rand(BATCH, SEQ, generator=g) ** 3 * args.vocab).long()
    return idx, torch.randint(0, CLASSES, (BATCH,), generator=g)


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def digest_offloaded(h, p) -> str:
    """digest() of offloaded ``p``'s stored value, block by block for a tiled one."""
    if not h.tiled(p):
        return digest(h.read(p))
    d = hashlib.sha256()
    for _, block in h.value_blocks(p):
        d.update(block.numpy().tobytes())
    return d.hexdigest()


def run_child(args) -> None:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    h = None
    if args.role == "offload":
        import strata
        import strata.torch as st
        store = strata.Store.open(args.dir, host_budget="16MiB", staging="16MiB",
                                  chunk_size="1MiB", durability="flush")
        with st.offload_init(store, working_set=args.working_set,
                             tile_bytes=args.tile_bytes) as h:
            model = build(args, meta=True)
        h.attach(model, overwrite=True)
        opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=store, arithmetic="torch",
                              overwrite=True, pinned_budget="16MiB")
        # (keep_vars: the parameters themselves; detach() would materialize the table)
        keys = sorted(model.state_dict(keep_vars=True).keys())
    else:
        model = build(args)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        keys = sorted(model.state_dict().keys())
    losses, seconds = [], []
    for step in range(args.steps):
        idx, y = batch(args, step)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(idx), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print(f"  [{args.role}] step {step + 1}/{args.steps}: loss {losses[-1]:.6f}, "
              f"{seconds[-1]:.2f} s", flush=True)
    if h is not None:
        digests = {n: digest_offloaded(h, p) for n, p in model.named_parameters()}
    else:
        digests = {n: digest(p) for n, p in model.named_parameters()}
    result = dict(losses=losses, seconds=seconds, digests=digests, keys=keys)
    if h is not None:
        result["stats"] = h.stats()
        result["tiled"] = [n for n, p in model.named_parameters() if h.tiled(p)]
        opt.close()
        h.close(restore=False)
        store.close()
    with open(args.result, "w") as f:
        json.dump(result, f)


def child_argv(args, role: str, result: str):
    argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--result", result]
    for k in ("vocab", "d_model", "steps", "seed", "threads", "working_set", "tile_bytes",
              "dir"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the short form (tests)")
    for k in ("vocab", "d_model", "steps"):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=None)
    for k in ("memory_limit", "working_set", "tile_bytes"):
        ap.add_argument(f"--{k.replace('_', '-')}", default=None)
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
    ws = strata.parse_size(args.working_set)
    table = 4 * args.vocab * args.d_model
    work = tempfile.mkdtemp(prefix="strata-tiled-")
    if args.dir is None:
        args.dir = os.path.join(work, "store")
    print(f"model: embedding {args.vocab} x {args.d_model} fp32 = {mib(table)} = "
          f"{table / limit:.2f} x the {mib(limit)} memory limit, {table / ws:.1f} x the "
          f"{mib(ws)} working set; tiled in blocks of {args.tile_bytes}")
    try:
        try:
            runs, failures = compare_runs(lambda role, res: child_argv(args, role, res),
                                          limit, work, oom_demo=not args.no_oom_demo)
        except MemoryLimitUnavailable as e:
            print(f"FAIL: no memory cgroup: {e}")
            return 1
        if table <= limit or table < 4 * ws:
            failures.append("the table is not larger than the limit and 4 x the working set")
        if len(runs) == 2:
            a, b = runs["offload"], runs["torch"]
            s = a["stats"]
            print("offload stats: " + ", ".join(
                f"{k} {s[k]:.3f}" if isinstance(s[k], float) else f"{k} {s[k]}"
                for k in ("bytes_fetched", "tile_blocks_fetched", "tile_fetch_seconds",
                          "tile_stall_seconds", "grad_bytes_written",
                          "peak_working_set_bytes")))
            print(f"tiled parameters: {a['tiled']}")
            if a["tiled"] != ["emb.weight"]:
                failures.append(f"tiled parameters {a['tiled']}, expected ['emb.weight']")
            if a["keys"] != b["keys"]:
                failures.append(f"state_dict keys differ: {a['keys']} vs {b['keys']}")
            if a["losses"] != b["losses"]:
                failures.append(f"losses differ: {a['losses']} vs {b['losses']}")
            diff = [n for n in b["digests"] if a["digests"].get(n) != b["digests"][n]]
            if diff:
                failures.append(f"{len(diff)} parameters differ, e.g. {diff[0]}")
            else:
                print(f"losses and all {len(b['digests'])} parameters bit-identical; "
                      f"state_dict keys {a['keys']}")
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
