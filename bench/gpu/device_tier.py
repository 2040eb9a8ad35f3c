#!/usr/bin/env python3
"""Device-tier bandwidth of a strata store, through the Python module with CUDA tensors.

One object of --size bytes (fp32), --rounds rounds, medians in GB/s (1e9 B/s):
  put_h2d    put from a pinned host tensor into the device tier (host -> HBM)
  put_d2d    put from a CUDA tensor into the device tier (HBM -> HBM)
  get_d2d    get_into a CUDA tensor from the device tier
  get_d2h    get_into a pinned host tensor from the device tier
  evict_nvme move device -> nvme (write-back through pinned staging)
  fetch_nvme move nvme -> device (NVMe -> pinned -> HBM, pipelined)
Every round checks the bytes that came back. Without CUDA, or a strata built without it,
it says why and exits 0 (the JSON then holds {"skipped": why}).

    PYTHONPATH=build/python python3 bench/gpu/device_tier.py --dir /nvme/x --size 1GiB
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get("STRATA_DIR", "/var/tmp"),
                                                  "strata-device-tier"))
    ap.add_argument("--size", default="1GiB", help="bytes per object (suffixes KiB, MiB, GiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures to this file too")
    a = ap.parse_args()

    def finish(res):
        print(json.dumps(res, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0

    try:
        import torch
        import strata
    except ImportError as e:
        return finish({"skipped": f"cannot import {e.name}"})
    if not torch.cuda.is_available():
        return finish({"skipped": "no CUDA device (torch.cuda.is_available() is False)"})
    if not strata.built_with_cuda:
        return finish({"skipped": "strata was built without CUDA"})

    nbytes = strata.parse_size(a.size)
    n = nbytes // 4
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    src = torch.randn(n, device="cuda")
    host = src.cpu().pin_memory()
    out_dev = torch.empty_like(src)
    out_host = torch.empty(n, pin_memory=True)
    torch.cuda.synchronize()
    times = {k: [] for k in ("put_h2d", "put_d2d", "get_d2d", "get_d2h", "evict_nvme",
                             "fetch_nvme")}

    def timed(name, fn):
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)

    with strata.Store.open(a.dir, device_budget=2 * nbytes + (64 << 20),
                           host_budget="256MiB") as s:
        if not s.has_device():
            return finish({"skipped": "the store sees no GPU"})
        for _ in range(a.rounds):
            timed("put_h2d", lambda: s.put("x", host, tier="device", overwrite=True))
            timed("put_d2d", lambda: s.put("x", src, tier="device", overwrite=True))
            out_dev.zero_()
            timed("get_d2d", lambda: s.get_into("x", out_dev))
            assert torch.equal(out_dev, src), "get_d2d: wrong bytes"
            out_host.zero_()
            timed("get_d2h", lambda: s.get_into("x", out_host))
            assert torch.equal(out_host, host), "get_d2h: wrong bytes"
            timed("evict_nvme", lambda: s.move("x", "nvme"))
            timed("fetch_nvme", lambda: s.move("x", "device"))
            assert s.stat("x").tier == "device"
            out_dev.zero_()
            s.get_into("x", out_dev)
            assert torch.equal(out_dev, src), "fetch_nvme: wrong bytes"
            s.delete("x")
    shutil.rmtree(a.dir, ignore_errors=True)
    res = {"bytes": nbytes, "rounds": a.rounds, "device": torch.cuda.get_device_name(0)}
    for k, v in times.items():
        res[k + "_gbps"] = nbytes / statistics.median(v) / 1e9
    return finish(res)


if __name__ == "__main__":
    sys.exit(main())
