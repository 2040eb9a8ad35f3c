#!/usr/bin/python3
"""The optimizer step overlapped with backward (overlap_backward=True) against the step
after backward, on a CPU model with its optimizer state on NVMe.

Two copies of one MLP (--layers Linear(width, width) layers, fp32, CPU) train on the same
batches, one with OffloadAdamW(overlap_backward=False) and one with True, each over its own
store under --path; their iterations alternate (so machine noise hits both), after
--warmup untimed iterations each. Per iteration: forward + backward, then step(). Also
measured in the same run, alternating with the iterations: the step's NVMe I/O alone
(every state object read and written back once, as a step does: 12 bytes per parameter
each way, by --io-threads threads in sub-group pieces) -- the limit the step cannot beat.

Reported (medians over --iters iterations, seconds): forward_backward_seconds (of the
sequential model: no hooks), step_io_seconds, iteration_seconds_{sequential,overlapped},
exposed_optimizer_seconds_{sequential,overlapped} (from the end of backward to the end of
step()), overlapped_seconds (early updates' time), the ratios the issue asks about, and a
check that both models' parameters are bit-identical at the end.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/overlap_step.py --json
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import strata
import strata.torch as st


def make_model(layers, width, seed=0):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def io_probe(store, piece_bytes, threads):
    """Seconds to read every object of ``store`` and write it back, piece by piece."""
    infos = store.list()
    work = []
    for info in infos:
        for off in range(0, info.nbytes, piece_bytes):
            work.append((info.key, off, min(piece_bytes, info.nbytes - off)))

    def one(item):
        key, off, n = item
        buf = store.read_range(key, off, n)
        store.write_range(key, off, buf)
        return n

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        moved = sum(pool.map(one, work))
    return time.perf_counter() - t0, moved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=724)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--path", default=None, help="directory for the stores (default: a "
                    "temporary one under $STRATA_DIR or /var/tmp, removed at the end)")
    ap.add_argument("--bucket-numel", type=int, default=1)
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    for name in ("layers", "width", "batch", "iters", "bucket_numel", "io_threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    base = args.path or tempfile.mkdtemp(prefix="strata-overlap-",
                                         dir=os.environ.get("STRATA_DIR", "/var/tmp"))
    os.makedirs(base, exist_ok=True)
    try:
        return run(args, base)
    finally:
        if args.path is None:
            shutil.rmtree(base, ignore_errors=True)


def run(args, base):
    models = {m: make_model(args.layers, args.width) for m in ("sequential", "overlapped")}
    opts = {}
    for mode, model in models.items():
        path = os.path.join(base, mode)
        shutil.rmtree(path, ignore_errors=True)
        opts[mode] = st.OffloadAdamW(model.parameters(), lr=1e-4, path=path, tier="nvme",
                                     overlap_backward=(mode == "overlapped"),
                                     overlap_bucket_numel=args.bucket_numel)
    numel = sum(p.numel() for p in models["sequential"].parameters())
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(args.batch, args.width, generator=g),
             torch.randn(args.batch, args.width, generator=g))
            for _ in range(args.warmup + args.iters)]
    rec = {m: {"fb": [], "exposed": [], "iter": [], "early": [], "rolled_back": 0}
           for m in models}
    io = []
    piece = opts["sequential"]._opt.sub_group_numel() * 4
    for i, (x, y) in enumerate(data):
        for mode in ("sequential", "overlapped"):
            model, opt = models[mode], opts[mode]
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if i < args.warmup:
                continue
            r = rec[mode]
            r["fb"].append(t1 - t0)
            # end of backward: the hook's callback time for the overlapped model
            end_bwd = opt._overlap.backward_end if mode == "overlapped" else t1
            r["exposed"].append(t2 - (end_bwd or t1))
            r["iter"].append(t2 - t0)
            r["early"].append(opt.last_step.get("early_seconds", 0.0))
            r["rolled_back"] += bool(opt.last_step.get("rolled_back", False))
        if i >= args.warmup:
            secs, moved = io_probe(opts["sequential"].store, piece, args.io_threads)
            io.append(secs)
    same = all(torch.equal(a, b) for a, b in zip(models["sequential"].parameters(),
                                                 models["overlapped"].parameters()))
    med = statistics.median
    out = {
        "params": numel, "layers": args.layers, "width": args.width, "batch": args.batch,
        "iters": args.iters, "state_bytes_per_step_each_way": 12 * numel,
        "forward_backward_seconds": med(rec["sequential"]["fb"]),
        "forward_backward_seconds_overlapped": med(rec["overlapped"]["fb"]),
        "step_io_seconds": med(io),
        "iteration_seconds_sequential": med(rec["sequential"]["iter"]),
        "iteration_seconds_overlapped": med(rec["overlapped"]["iter"]),
        "exposed_optimizer_seconds_sequential": med(rec["sequential"]["exposed"]),
        "exposed_optimizer_seconds_overlapped": med(rec["overlapped"]["exposed"]),
        "overlapped_seconds": med(rec["overlapped"]["early"]),
        "rolled_back_steps": rec["overlapped"]["rolled_back"],
        "bit_identical": same,
    }
    limit = max(out["forward_backward_seconds"], out["step_io_seconds"])
    out["exposed_ratio"] = (out["exposed_optimizer_seconds_overlapped"]
                            / out["exposed_optimizer_seconds_sequential"])
    out["iteration_over_limit_overlapped"] = out["iteration_seconds_overlapped"] / limit
    out["iteration_over_limit_sequential"] = out["iteration_seconds_sequential"] / limit
    for o in opts.values():
        o.close()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:40s} {v:.4f}" if isinstance(v, float) else f"{k:40s} {v}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
