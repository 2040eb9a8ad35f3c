#!/usr/bin/python3
"""Tiling (strata.torch.offload_parameters(tile_bytes=...)) against the same offloaded
training with a working set that holds the whole tensor, on a language-model-shaped
model: ``nn.Embedding(--vocab, --d-model)`` whose weight is also the output head
(``F.linear(h, emb.weight)``, tied), between them --layers ``Linear(d, d)`` + tanh; loss:
next-token cross-entropy over --batch x --seq ids; OffloadAdamW (torch's arithmetic).

Two child processes (this script with a hidden --child flag, driven one iteration per
command over stdin/stdout pipes) train it from the same seed on the same batches:

  T. tiled: a working set of --working-set bytes (less than the table), the table in
     blocks of --tile-bytes (the embedding reads only its ids' rows; the head reads every
     block in forward, last to first, the first ones read ahead of the use, and keeps the
     ones it holds at its end for its backward, which reads the others; its gradient
     written block by block, the embedding's rows added to it, and stepped from the
     store);
  W. whole: a working set that holds the whole table (--working-set + the table's bytes),
     nothing tiled: the table is fetched whole, its gradient materialized whole.

One iteration = forward + backward + step + zero_grad, timed in the child. Each child runs
--warmup untimed iterations, then the two take turns, one iteration each, --iters times
(the first of each turn alternating); figures are medians over those iterations. Peak RSS
is each child's VmHWM since its start.

``--json`` prints one object: ``tiled_iteration_seconds`` (T), ``whole_iteration_seconds``
(W), ``tiled_ratio`` (T / W; the issue's goal: at most 1.10), ``table_bytes``,
``tile_bytes``, ``tile_blocks_fetched``, ``tile_blocks_ahead``, ``tile_fetch_seconds``,
``tile_stall_seconds``, ``grad_bytes_written``, ``grad_bytes_read`` (per iteration of T),
``bytes_fetched`` of each, ``peak_rss_bytes`` (T) and
``peak_rss_bytes_whole`` (W), ``max_abs_loss_difference`` (T's losses against W's: the
tied head's summation order, docs/offload.md "Tiling"). Everything under --path is removed
on exit.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/tiled_offload.py --json
    ... --vocab 4096 --d-model 64 --iters 2 --warmup 1 --json     # quick run (the test's)
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


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def child(args) -> None:
    import torch
    import torch.nn.functional as F

    import strata
    import strata.torch as st
    torch.set_num_threads(args.threads)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(args.vocab, args.d_model)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(args.d_model, args.d_model)
                                              for _ in range(args.layers))

        def forward(self, idx):
            h = self.emb(idx)
            for layer in self.layers:
                h = torch.tanh(layer(h))
            return F.linear(h, self.emb.weight)  # the tied output head

    table = 4 * args.vocab * args.d_model
    ws = strata.parse_size(args.working_set)
    store = strata.Store.open(os.path.join(args.path, args.child), chunk_size="1MiB",
                              host_budget="16MiB", staging="16MiB", durability="flush")
    torch.manual_seed(args.seed)
    if args.child == "tiled":
        with st.offload_init(store, working_set=ws, tile_bytes=args.tile_bytes) as h:
            model = LM()
    else:
        with st.offload_init(store, working_set=ws + table) as h:
            model = LM()
    h.attach(model)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=store, arithmetic="torch",
                          pinned_budget="32MiB")
    step = 0
    for line in sys.stdin:
        if line.strip() != "step":
            break
        g = torch.Generator().manual_seed(1000 + step)
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        step += 1
        h.reset_stats()
        t0 = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        out = {"seconds": time.perf_counter() - t0, "loss": loss.item()}
        out.update(h.stats())
        del logits, loss
        print(json.dumps(out), flush=True)
    print(json.dumps({"peak_rss_bytes": _vm_hwm()}), flush=True)
    opt.close()
    h.close(restore=False)
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--working-set", default="64MiB")
    ap.add_argument("--tile-bytes", default="16MiB")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", default=None, help="store directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=["tiled", "whole"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    import strata
    made = args.path is None
    args.path = args.path or tempfile.mkdtemp(prefix="strata-bench-tiled-")
    os.makedirs(args.path, exist_ok=True)
    names = ("tiled", "whole")
    procs = {}
    try:
        for n in names:
            argv = [sys.executable, os.path.abspath(__file__), "--child", n]
            for k in ("vocab", "d_model", "layers", "batch", "seq", "working_set",
                      "tile_bytes", "threads", "seed", "path"):
                argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            procs[n] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        runs = {n: [] for n in names}
        for i in range(args.warmup + args.iters):
            for n in (names if i % 2 == 0 else names[::-1]):
                p = procs[n]
                p.stdin.write("step\n")
                p.stdin.flush()
                line = p.stdout.readline()
                if not line:
                    print(f"bench: the {n} child ended early (exit status {p.wait()})",
                          file=sys.stderr)
                    return 1
                if i >= args.warmup:
                    runs[n].append(json.loads(line))
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

    def med(n, k):
        return statistics.median(r[k] for r in runs[n])

    t, w = med("tiled", "seconds"), med("whole", "seconds")
    out = {"tiled_iteration_seconds": t, "whole_iteration_seconds": w, "tiled_ratio": t / w,
           "table_bytes": 4 * args.vocab * args.d_model,
           "tile_bytes": strata.parse_size(args.tile_bytes),
           "tile_blocks_fetched": int(med("tiled", "tile_blocks_fetched")),
           "tile_blocks_ahead": int(med("tiled", "tile_blocks_ahead")),
           "grad_bytes_written": int(med("tiled", "grad_bytes_written")),
           "grad_bytes_read": int(med("tiled", "grad_bytes_read")),
           "tile_fetch_seconds": med("tiled", "tile_fetch_seconds"),
           "tile_stall_seconds": med("tiled", "tile_stall_seconds"),
           "bytes_fetched": int(med("tiled", "bytes_fetched")),
           "bytes_fetched_whole": int(med("whole", "bytes_fetched")),
           "peak_rss_bytes": peaks["tiled"], "peak_rss_bytes_whole": peaks["whole"],
           "max_abs_loss_difference": max(abs(a["loss"] - b["loss"]) for a, b in
                                          zip(runs["tiled"], runs["whole"])),
           "config": {k: getattr(args, k) for k in ("vocab", "d_model", "layers", "batch",
                                                     "seq", "working_set", "tile_bytes",
                                                     "iters", "warmup")}}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
