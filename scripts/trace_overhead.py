#!/usr/bin/env python3
"""The cost of strata's timeline (docs/offload.md, "A timeline"): one small offloaded model
(an MLP, working set a third of its parameters, OffloadAdamW) trained in rounds that
alternate ``--iters`` iterations untraced with as many under ``strata.torch.trace``; prints
the median iteration time of each and their ratio as JSON.

    PYTHONPATH=build/python python3 scripts/trace_overhead.py --rounds 8
"""

import argparse
import json
import statistics
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import strata.torch as st


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=3, help="iterations per round and mode")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    x = torch.randn(64, args.width)
    y = torch.randint(0, 10, (64,))
    with tempfile.TemporaryDirectory() as d:
        h = st.offload_parameters(model, path=d + "/s", working_set=nbytes // 3)
        opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=h.store)

        def iteration():
            t0 = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            return time.perf_counter() - t0

        for _ in range(3):
            iteration()
        times = {"off": [], "on": []}
        events = 0
        for _ in range(args.rounds):
            times["off"] += [iteration() for _ in range(args.iters)]
            st.start_trace()
            times["on"] += [iteration() for _ in range(args.iters)]
            events += len(st.stop_trace()["traceEvents"])
        opt.close()
        h.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(json.dumps({"parameters": nbytes // 4, "parameter_tensors": len(list(
        model.parameters())), "iterations_each": len(times["on"]), "median_off_s": round(off, 5),
        "median_on_s": round(on, 5), "ratio": round(on / off, 4),
        "events_per_iteration": events // len(times["on"])}, indent=1))


if __name__ == "__main__":
    main()
