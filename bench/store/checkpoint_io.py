#!/usr/bin/python3
"""Checkpoint import and export at the drive's speed: strata.torch.load_safetensors into
offloaded parameters and save_safetensors out of them, against fio on the same directory
in the same run, optionally under a memory cgroup smaller than the checkpoint.

1. The parent writes a safetensors checkpoint of --size bytes under --path (--layers
   tensors of --dtype, values a function of the position; written by a plain writer of the
   format with O_DIRECT, so none of it is in the page cache) and measures
   the drive with fio (bench/optimizer/param_offload.py's fio_gbps: O_DIRECT, 1 MiB blocks,
   queue depth 32, io_uring; a --fio-size file, --fio-seconds per run).
2. A child process (this script with --child; inside a memory cgroup of --memory-limit
   bytes when given: examples/memory_limit.py) builds the model inside offload_init with
   device="meta" (nn.Linear layers: nothing allocated, zeros made in a strata store under
   --path), loads the checkpoint (timed: import), saves it into a new directory (timed:
   export, --max-shard-size), and prints its figures: seconds, bytes, VmHWM.
3. The parent checks that the export holds the checkpoint's tensors byte for byte (names,
   dtypes, shapes; the bytes regenerated and compared piece by piece), then prints one JSON object (--json) or a
   table: import_bytes_per_s and export_bytes_per_s (tensor bytes / child's wall time of the
   call), fio_read_bytes_per_s, fio_write_bytes_per_s, their ratios to min(fio read, fio
   write) (the goal: >= 0.8), peak_rss_bytes (the child's VmHWM), the cgroup's peak charge
   and the limit.

Import moves every byte twice (read from the file, written into the store), export too
(read from the store, written to the file). With the file and the store on one drive, reads
and writes share it: fio_mixed_bytes_per_s (fio reading and writing 50/50 at once, half
their sum: the rate bytes can go through the drive in and out together) is then the limit,
below min(fio read, fio write) on drives that cannot do both at full speed at once (this
VM's disk: ~0.6 GB/s each way mixed, ~1.0 GB/s read and ~1.5 GB/s write alone).

    PYTHONPATH=build/python /usr/bin/python3 bench/store/checkpoint_io.py --json
    ... --size 1GiB --memory-limit 256MiB --json       # 4x the limit
Everything under --path is removed on exit. Exit status 0 when the round trip is
bit-identical (and the child was not killed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "optimizer"))

COLS = 4096  # every tensor is [rows, COLS]
ST_NAME = {"fp32": ("F32", 4), "bf16": ("BF16", 2), "fp16": ("F16", 2)}


def size_arg(text: str) -> int:
    import strata
    return strata.parse_size(text) if not text.isdigit() else int(text)


def layout(size: int, layers: int, dtype: str):
    """[(name, rows)] of `layers` tensors of [rows, COLS] adding up to about `size` bytes."""
    es = ST_NAME[dtype][1]
    rows = max(1, size // (layers * COLS * es))
    return [(f"layers.{i}.weight", rows) for i in range(layers)]


_BASE = []


def block(i: int, offset: int, n: int) -> bytes:
    """Bytes [offset, offset + n) of tensor i (offset a multiple of 16 MiB, n <= 16 MiB): a
    fixed pseudo-random 16 MiB block whose first 16 bytes are replaced by (i, offset), so
    every piece of every tensor differs (finite values in every dtype: each 16-bit lane's
    exponent top bit cleared)."""
    import numpy as np
    if not _BASE:
        words = np.random.default_rng(27).integers(0, 2**63, 2 << 20, dtype=np.uint64)
        _BASE.append((words & np.uint64(0xBFFFBFFFBFFFBFFF)).tobytes())
    return (struct.pack("<QQ", i & 0x3FFF3FFF3FFF3FFF, offset & 0x3FFF3FFF3FFF3FFF)
            + _BASE[0][16:])[:n]


def write_checkpoint(path: str, tensors, dtype: str) -> None:
    """The checkpoint, as the format's specification lays it out, written with O_DIRECT
    (not left in the page cache for the import to find)."""
    st, es = ST_NAME[dtype]
    header, pos = {}, 0
    for name, rows in tensors:
        n = rows * COLS * es
        header[name] = {"dtype": st, "shape": [rows, COLS], "data_offsets": [pos, pos + n]}
        pos += n
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    out = _DirectWriter(path)
    out.write(struct.pack("<Q", len(text)) + text)
    for i, (name, rows) in enumerate(tensors):
        n = rows * COLS * es
        for off in range(0, n, 16 << 20):
            out.write(block(i, off, min(16 << 20, n - off)))
    out.close()


class _DirectWriter:
    """Sequential O_DIRECT writes through one page-aligned 16 MiB buffer (an anonymous
    mmap); the last piece padded to 4096 bytes, then the file truncated to its size and
    fsync'd: no page cache to drop, and ~3x faster than buffered writes on this VM."""

    def __init__(self, path: str):
        import mmap
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        self.buf = mmap.mmap(-1, 16 << 20)
        self.fill = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            k = min(len(view), len(self.buf) - self.fill)
            self.buf[self.fill:self.fill + k] = view[:k]
            self.fill += k
            view = view[k:]
            if self.fill == len(self.buf):
                self._flush(self.fill)

    def _flush(self, n: int) -> None:
        padded = -(-n // 4096) * 4096
        self.buf[n:padded] = bytes(padded - n)
        os.write(self.fd, memoryview(self.buf)[:padded])
        self.size += n
        self.fill = 0

    def close(self) -> None:
        if self.fill:
            self._flush(self.fill)
        os.ftruncate(self.fd, self.size)
        os.fsync(self.fd)
        os.close(self.fd)
        self.buf.close()


def export_matches(path: str, tensors, dtype: str) -> bool:
    """The safetensors files in ``path`` hold exactly the checkpoint's tensors (names,
    dtype, shapes, every byte; read with O_DIRECT in aligned supersets of 16 MiB pieces)."""
    import mmap
    st, es = ST_NAME[dtype]
    want = {name: (i, rows) for i, (name, rows) in enumerate(tensors)}
    seen = set()
    buf = mmap.mmap(-1, (16 << 20) + 8192)
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        full = os.path.join(path, f)
        with open(full, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        fd = os.open(full, os.O_RDONLY | os.O_DIRECT)
        try:
            for name, e in header.items():
                if name not in want or e["dtype"] != st or e["shape"] != [want[name][1], COLS]:
                    return False
                i, rows = want[name]
                b, end = e["data_offsets"]
                if end - b != rows * COLS * es:
                    return False
                for off in range(0, end - b, 16 << 20):
                    k = min(16 << 20, end - b - off)
                    at = 8 + n + b + off
                    lo = at // 4096 * 4096
                    got = os.preadv(fd, [memoryview(buf)[:-(-(at + k - lo) // 4096) * 4096]], lo)
                    if got < at + k - lo or buf[at - lo:at - lo + k] != block(i, off, k):
                        return False
                seen.add(name)
        finally:
            os.close(fd)
    buf.close()
    return seen == set(want)


def child(args) -> None:
    import torch
    import strata
    import strata.torch as st
    tensors = layout(args.size, args.layers, args.dtype)
    store = strata.Store.open(os.path.join(args.path, "store"), host_budget="8MiB",
                              staging="8MiB", chunk_size="4MiB")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    with st.offload_init(store, working_set="16MiB") as h:
        model = torch.nn.Module()
        model.layers = torch.nn.ModuleList(
            torch.nn.Linear(COLS, rows, bias=False, device="meta", dtype=dtype)
            for _, rows in tensors)
    h.attach(model)
    kw = dict(piece_bytes=args.piece_bytes, pieces=args.pieces)
    t0 = time.perf_counter()
    res = st.load_safetensors(model, os.path.join(args.path, "ckpt", "model.safetensors"), **kw)
    t1 = time.perf_counter()
    assert tuple(res) == ([], []), res
    st.save_safetensors(h, os.path.join(args.path, "export"), max_shard_size=args.max_shard_size,
                        **kw)
    t2 = time.perf_counter()
    h.close(restore=False)
    store.close()
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"import_seconds": t1 - t0, "export_seconds": t2 - t1,
                      "peak_rss_bytes": hwm}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=size_arg, default=size_arg("2GiB"),
                    help="checkpoint bytes (default 2GiB)")
    ap.add_argument("--layers", type=int, default=16, help="tensors (default 16)")
    ap.add_argument("--dtype", choices=sorted(ST_NAME), default="fp32",
                    help="the checkpoint's and the model's dtype (default fp32)")
    ap.add_argument("--path", default=None, help="directory for the checkpoint, the store, "
                    "the export and fio's file (a new subdirectory, removed at exit; default: "
                    "$TMPDIR or /var/tmp)")
    ap.add_argument("--memory-limit", type=size_arg, default=None,
                    help="run the child in a memory cgroup of this many bytes (root)")
    ap.add_argument("--max-shard-size", default="5GB", help="export's shard size (default 5GB)")
    ap.add_argument("--piece-bytes", type=size_arg, default=None,
                    help="strata's piece bytes (default $STRATA_CHECKPOINT_PIECE_BYTES or 8MiB)")
    ap.add_argument("--pieces", type=int, default=None, help="pieces in flight (default 4)")
    ap.add_argument("--fio-size", type=size_arg, default=size_arg("1GiB"))
    ap.add_argument("--fio-seconds", type=float, default=3.0)
    ap.add_argument("--no-fio", action="store_true", help="skip fio (figures 0)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    base = tempfile.mkdtemp(prefix="strata-ckpt-bench-",
                            dir=args.path or os.environ.get("TMPDIR") or "/var/tmp")
    try:
        return run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(args, base: str) -> int:
    from param_offload import fio_gbps  # bench/optimizer: the same fio command
    tensors = layout(args.size, args.layers, args.dtype)
    os.makedirs(os.path.join(base, "ckpt"))
    write_checkpoint(os.path.join(base, "ckpt", "model.safetensors"), tensors, args.dtype)
    nbytes = sum(rows * COLS * ST_NAME[args.dtype][1] for _, rows in tensors)
    fio_r = fio_w = fio_m = 0.0
    if not args.no_fio:
        fio_file = os.path.join(base, "fio.bin")
        fio_w = fio_gbps(fio_file, "write", args.fio_size, args.fio_seconds) * 1e9
        fio_r = fio_gbps(fio_file, "read", args.fio_size, args.fio_seconds) * 1e9
        fio_m = fio_gbps(fio_file, "rw", args.fio_size, args.fio_seconds) * 1e9 / 2
        os.unlink(fio_file)
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--path", base,
            "--size", str(args.size), "--layers", str(args.layers), "--dtype", args.dtype,
            "--max-shard-size", str(args.max_shard_size)]
    for flag, v in (("--piece-bytes", args.piece_bytes), ("--pieces", args.pieces)):
        if v is not None:
            argv += [flag, str(v)]
    cg_peak, rc = -1, 0
    out_text = ""
    if args.memory_limit:
        from memory_limit import MemoryLimit
        with MemoryLimit(args.memory_limit) as lim:
            with open(os.path.join(base, "child.out"), "w") as out:
                rc = lim.run(argv, stdout=out, timeout=1800)
            cg_peak = lim.peak_bytes()
        with open(os.path.join(base, "child.out")) as f:
            out_text = f.read()
    else:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        rc, out_text = p.returncode, p.stdout
        sys.stderr.write(p.stderr)
    if rc != 0:
        print(f"checkpoint_io: the child failed (exit status {rc}): {out_text}", file=sys.stderr)
        return 1
    fig = json.loads(out_text.strip().splitlines()[-1])
    identical = export_matches(os.path.join(base, "export"), tensors, args.dtype)
    lo = min(fio_r, fio_w)
    res = {"checkpoint_bytes": nbytes, "tensors": len(tensors), "dtype": args.dtype,
           "import_bytes_per_s": nbytes / fig["import_seconds"],
           "export_bytes_per_s": nbytes / fig["export_seconds"],
           "import_seconds": fig["import_seconds"], "export_seconds": fig["export_seconds"],
           "fio_read_bytes_per_s": fio_r, "fio_write_bytes_per_s": fio_w,
           "fio_mixed_bytes_per_s": fio_m,
           "import_over_min_fio": nbytes / fig["import_seconds"] / lo if lo else 0.0,
           "export_over_min_fio": nbytes / fig["export_seconds"] / lo if lo else 0.0,
           "import_over_fio_mixed": nbytes / fig["import_seconds"] / fio_m if fio_m else 0.0,
           "export_over_fio_mixed": nbytes / fig["export_seconds"] / fio_m if fio_m else 0.0,
           "peak_rss_bytes": fig["peak_rss_bytes"], "memory_limit_bytes": args.memory_limit or 0,
           "cgroup_peak_bytes": cg_peak, "bit_identical": identical}
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v:.4g}" if isinstance(v, float) else f"{k:24} {v}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
