#!/usr/bin/python3
"""Parameter offload (strata.torch.offload_parameters + OffloadAdamW) against the same
training with everything in memory (torch.optim.AdamW), on the main job's model.

The model and batches are examples/train_offload.py's (its --preset: "main", the main
job's GPT, 11 layers x d_model 1024, 138.7 M parameters, working set 64 MiB; "tiny" for a
quick run). Three child processes (this script with a hidden --child flag, driven one
iteration per command over stdin/stdout pipes) train it from the same seed on the same
batches:

  A. offloaded: the model built inside offload_init (parameters go to a strata store under
     --path as they are made), attached, OffloadAdamW (--arithmetic, default simd;
     --overlap-backward passes overlap_backward=True) with its state in the same store,
     parameter working set --working-set;
  B. in memory: torch.optim.AdamW;
  R. resident: as A in a store of its own, with a working set that holds every parameter
     (--resident-working-set, default twice the model's parameter bytes): nothing is
     evicted, so what it costs over B is the offload's own work, not the drive's.

One iteration = forward + backward (+ clip_grad_norm_ for B when --max-grad-norm > 0; A and
R clip inside their step; 0 = no clipping) + step + zero_grad, timed in the child. Each
child runs --warmup untimed iterations, then the three take turns, one iteration each,
--iters times, the first of each turn rotating (so machine noise hits all); figures are
medians over those iterations. Per iteration of A, from ParameterOffload.stats() deltas:
fetch and stall seconds, prefetch hits and misses; and every byte the iteration moved
from and to the store (examples/train_offload.py's store_bytes(): parameters fetched,
gradients written and read, edited parameters written back, parameter values stored by the
step, the optimizer's masters and moments read and written, from OffloadAdamW.stats()).
Peak RSS is each child's VmHWM over the timed iterations (reset after the warm-up through
/proc/self/clear_refs) and since its start.

The drive's sequential bandwidth is measured with fio (O_DIRECT, 1 MiB blocks, queue
depth 32, io_uring, a file under --path) before and after the iterations; the median of
those runs gives read and write GB/s and the I/O bound of an offloaded iteration,
``io_bound_seconds = bytes read / read B/s + bytes written / write B/s``: no offloaded
iteration can be faster (unless the store's host tier or the page cache serve it).
``io_bound_over_in_memory`` is that bound over the in-memory iteration: the best throughput
ratio the drive allows is its inverse, so above 1.25 the drive cannot allow a ratio of 0.8.

Everything written under --path (the stores, the fio file) is removed on every exit.
Exit status 0 when every child finished every iteration and the bandwidth was measured.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimizer/param_offload.py --json
    ... --preset tiny --iters 2 --warmup 1 --json          # quick run (the test's)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
from train_offload import (PRESETS, READ_COUNTERS, WRITE_COUNTERS,  # noqa: E402
                           build, bytes_moved, store_bytes)

#: ParameterOffload.stats() counters taken per iteration (deltas; the bytes moved come from
#: train_offload.store_bytes())
_COUNTERS = ("fetch_seconds", "stall_seconds", "prefetch_hits", "prefetch_misses",
             "resident_hits", "trace_mismatches")
#: the children's roles: offloaded, in memory, offloaded with a working set holding the model
ROLES = ("offload", "memory", "resident")


# ---- child side ------------------------------------------------------------------------------

def _vm_hwm() -> int:
    """This process's peak resident set (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _reset_hwm() -> bool:
    """Resets VmHWM to the current RSS (/proc/self/clear_refs "5"); False when refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Trainer:
    """One child's model, batches and optimizer (a role of ROLES)."""

    def __init__(self, cfg: dict):
        import torch
        torch.set_num_threads(cfg["threads"])
        from train_lm import param_groups
        self.cfg = cfg
        self.role = cfg["role"]
        args = argparse.Namespace(**cfg)
        self.handle = self.store = None
        if self.role != "memory":
            import strata
            import strata.torch as st
            self.store = strata.Store.open(cfg["store_dir"], host_budget="16MiB",
                                           staging="16MiB", chunk_size="1MiB",
                                           durability="flush")
            with st.offload_init(self.store, working_set=cfg["working_set"],
                                 release_memory=cfg["release_memory"]) as self.handle:
                self.model, self.batches, self.vocab = build(args)
            self.handle.attach(self.model, overwrite=True)
            self.opt = st.OffloadAdamW(param_groups(self.model, cfg["weight_decay"]),
                                       lr=cfg["lr"], store=self.store,
                                       arithmetic=cfg["arithmetic"], overwrite=True,
                                       max_grad_norm=cfg["max_grad_norm"],
                                       overlap_backward=cfg["overlap_backward"])
        else:
            self.model, self.batches, self.vocab = build(args)
            self.opt = torch.optim.AdamW(param_groups(self.model, cfg["weight_decay"]),
                                         lr=cfg["lr"])
        self.params = sum(p.numel() for p in self.model.parameters())
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.hwm_before_reset = None

    def iteration(self) -> dict:
        """One timed iteration: seconds (whole, forward + backward, step + zero_grad), the
        loss, and for an offloaded role its counters' deltas and bytes moved (bytes)."""
        import torch
        import torch.nn.functional as F
        import resource
        x, y = self.batches.next()
        if self.handle is not None:
            before, bytes_before = self.handle.stats(), store_bytes(self.handle, self.opt)
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, self.vocab), y.view(-1))
        loss.backward()
        if self.handle is None and self.cfg["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_grad_norm"])
        t1 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad()
        t2 = time.perf_counter()
        out = dict(seconds=t2 - t0, forward_backward_seconds=t1 - t0,
                   optimizer_seconds=t2 - t1, loss=loss.item(),
                   minor_faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0)
        if self.handle is not None:
            after = self.handle.stats()
            for k in _COUNTERS:
                out[k] = after[k] - before[k]
            out.update(bytes_moved(bytes_before, store_bytes(self.handle, self.opt)))
            out["step_skipped"] = bool(self.opt.last_step["skipped"])
        return out

    def reset(self) -> dict:
        """End of warm-up: counters and VmHWM start again."""
        self.hwm_before_reset = _vm_hwm()
        if self.handle is not None:
            self.handle.reset_stats()
        return dict(hwm_reset=_reset_hwm(), vm_hwm_before_reset=self.hwm_before_reset)

    def final(self) -> dict:
        from strata.torch.offload._memory import mmap_threshold_fixed
        hwm = _vm_hwm()
        out = dict(vm_hwm=hwm, vm_hwm_since_start=max(hwm, self.hwm_before_reset or 0),
                   mmap_threshold_fixed=mmap_threshold_fixed())
        if self.handle is not None:
            st = self.handle.stats()
            out["peak_working_set_bytes"] = st["peak_working_set_bytes"]
            out["working_set_bytes"] = st["working_set_bytes"]
        return out

    def close(self) -> None:
        if self.handle is not None:
            self.opt.close()
            self.handle.close(restore=False)
            self.store.close()


def child_main(cfg: dict) -> int:
    """Serves commands (one line each on stdin: iter, reset, final, quit), answering one
    JSON line each on the original stdout; torch's and strata's own output goes to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        trainer = _Trainer(cfg)
        reply(dict(ready=True, params=trainer.params, param_bytes=trainer.param_bytes,
                   vm_hwm=_vm_hwm()))
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "quit":
                break
            if cmd == "iter":
                reply(trainer.iteration())
            elif cmd == "reset":
                reply(trainer.reset())
            elif cmd == "final":
                reply(trainer.final())
            else:
                raise ValueError(f"unknown command {cmd!r}")
        trainer.close()
        reply(dict(closed=True))
        return 0
    except BaseException:  # noqa: BLE001 (reported to the parent)
        reply(dict(error=f"{cfg['role']} child: {traceback.format_exc()}"))
        return 1


# ---- parent side -----------------------------------------------------------------------------

class ChildFailed(RuntimeError):
    pass


class Child:
    """A child process and its command pipe."""

    def __init__(self, role: str, cfg: dict):
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise ChildFailed(f"{self.role} child exited (status {rc}) without an answer")
        msg = json.loads(line)
        if "error" in msg:
            raise ChildFailed(msg["error"])
        return msg

    def ask(self, cmd: str) -> dict:
        try:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # recv() reports the exit
        return self.recv()

    def quit(self) -> int:
        """Closes the child (its store closed); its exit status."""
        self.ask("quit")
        self.proc.stdin.close()
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def fio_gbps(path: str, rw: str, size: int, seconds: float) -> float:
    """Sequential O_DIRECT bandwidth of ``rw`` ("read" or "write"; "rw": reads and writes
    mixed 50/50, their sum) on the file ``path`` (1 MiB blocks, queue depth 32, io_uring),
    GB/s (1e9 bytes)."""
    cmd = ["fio", "--name=strata-bench", f"--filename={path}", f"--rw={rw}", "--bs=1M",
           "--iodepth=32", "--direct=1", "--ioengine=io_uring", f"--size={size}",
           "--time_based", f"--runtime={seconds}s", "--ramp_time=0", "--numjobs=1",
           "--output-format=json"] + (["--rwmixread=50"] if rw == "rw" else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    if p.returncode != 0:
        raise RuntimeError(f"fio {rw} on {path} failed (exit status {p.returncode}): "
                           f"{p.stderr.strip()}")
    job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
    bw = sum(job[d]["bw_bytes"] for d in ("read", "write")) if rw == "rw" else job[rw]["bw_bytes"]
    if bw <= 0:
        raise RuntimeError(f"fio {rw} on {path} measured no bandwidth")
    return bw / 1e9


def measure_drive(path: str, size: int, seconds: float, out: dict) -> None:
    out["write"].append(fio_gbps(path, "write", size, seconds))  # writes the file first
    out["read"].append(fio_gbps(path, "read", size, seconds))


def resident_working_set(args, param_bytes: int) -> int:
    """The resident run's working set, bytes: --resident-working-set, or twice the model's
    parameter bytes rounded up to a MiB; at least the parameter bytes (ValueError)."""
    if args.resident_working_set is None:
        return -(-2 * param_bytes // (1 << 20)) << 20
    if args.resident_working_set < param_bytes:
        raise ValueError(f"--resident-working-set: {args.resident_working_set} bytes cannot "
                         f"hold the model's {param_bytes} bytes of parameters")
    return args.resident_working_set


def run(args, base: str) -> dict:
    cfg = {k: getattr(args, k) for k in (
        "layers", "d_model", "heads", "context", "batch", "lr", "weight_decay",
        "max_grad_norm", "seed", "threads", "corpus", "corpus_bytes", "working_set",
        "arithmetic", "overlap_backward", "release_memory")}
    fio_file = os.path.join(base, "fio.bin")
    drive = {"read": [], "write": []}
    measure_drive(fio_file, args.fio_size, args.fio_seconds, drive)
    os.unlink(fio_file)
    children = {}

    def start(role: str, **extra) -> None:
        children[role] = Child(role, dict(cfg, role=role, **extra,
                                          store_dir=os.path.join(base, f"store-{role}")))

    try:
        start("offload")
        start("memory")
        ready = {"offload": children["offload"].recv()}
        # the resident run's working set follows from the model's size, known now
        start("resident", working_set=resident_working_set(args, ready["offload"]["param_bytes"]))
        for role in ("memory", "resident"):
            ready[role] = children[role].recv()
        warm = {role: [] for role in ROLES}
        for _ in range(args.warmup):
            for role in ROLES:
                warm[role].append(children[role].ask("iter"))
        resets = {role: children[role].ask("reset") for role in ROLES}
        rec = {role: [] for role in ROLES}
        for i in range(args.iters):
            # rotate which goes first, so none always follows the same other
            k = i % len(ROLES)
            for role in ROLES[k:] + ROLES[:k]:
                rec[role].append(children[role].ask("iter"))
        final = {role: children[role].ask("final") for role in ROLES}
        for role in ROLES:
            rc = children[role].quit()
            if rc != 0:
                raise ChildFailed(f"{role} child exited with status {rc}")
    finally:
        for c in children.values():
            c.kill()
    measure_drive(fio_file, args.fio_size, args.fio_seconds, drive)
    os.unlink(fio_file)
    return summarize(args, ready, resets, warm, rec, final, drive)


def summarize(args, ready, resets, warm, rec, final, drive) -> dict:
    """The JSON object (see docs/offload.md, "Benchmark: parameter offload against
    in-memory training"): seconds are per iteration and medians over the timed
    iterations, bytes per iteration and medians, unless a name says otherwise."""
    med = statistics.median
    a, b, r = rec["offload"], rec["memory"], rec["resident"]

    def m(key, runs=a):
        return med(x[key] for x in runs)

    params = ready["offload"]["params"]
    out = dict(preset=args.preset, layers=args.layers, d_model=args.d_model,
               context=args.context, batch=args.batch, iters=args.iters,
               warmup=args.warmup, threads=args.threads, arithmetic=args.arithmetic,
               max_grad_norm=args.max_grad_norm, overlap_backward=args.overlap_backward,
               params=params, param_bytes=ready["offload"]["param_bytes"])
    out["offloaded_iteration_seconds"] = m("seconds")
    out["in_memory_iteration_seconds"] = m("seconds", b)
    out["resident_iteration_seconds"] = m("seconds", r)
    out["offloaded_ratio"] = out["offloaded_iteration_seconds"] / out[
        "in_memory_iteration_seconds"]
    out["resident_ratio"] = out["resident_iteration_seconds"] / out[
        "in_memory_iteration_seconds"]
    out["throughput_ratio"] = out["in_memory_iteration_seconds"] / out[
        "offloaded_iteration_seconds"]
    # the first iteration of all (no trace yet: fetches on demand), not a median
    out["first_iteration_seconds"] = warm["offload"][0]["seconds"]
    for name, runs in (("offloaded", a), ("in_memory", b), ("resident", r)):
        out[f"{name}_forward_backward_seconds"] = m("forward_backward_seconds", runs)
        out[f"{name}_optimizer_seconds"] = m("optimizer_seconds", runs)
        out[f"{name}_minor_faults"] = int(m("minor_faults", runs))
    out["fetch_seconds"] = m("fetch_seconds")
    out["stall_seconds"] = m("stall_seconds")
    out["stall_fraction"] = (out["stall_seconds"] / out["fetch_seconds"]
                             if out["fetch_seconds"] > 0 else 0.0)
    for k in ("prefetch_hits", "prefetch_misses", "resident_hits", "trace_mismatches"):
        out[k] = int(m(k))
    # every iteration after the first of all: the warm-up's others and the timed ones
    steady = warm["offload"][1:] + a
    out["steady_prefetch_misses"] = int(sum(x["prefetch_misses"] for x in steady))
    out["steady_iterations"] = len(steady)
    for k in READ_COUNTERS + WRITE_COUNTERS:
        out[k] = int(m(k))
    out["bytes_read_per_iteration"] = int(m("read"))
    out["bytes_written_per_iteration"] = int(m("written"))
    out["bytes_moved_per_iteration"] = (out["bytes_read_per_iteration"]
                                        + out["bytes_written_per_iteration"])
    out["bytes_read_per_param"] = out["bytes_read_per_iteration"] / params
    out["bytes_written_per_param"] = out["bytes_written_per_iteration"] / params
    out["drive_read_gbps"] = med(drive["read"])
    out["drive_write_gbps"] = med(drive["write"])
    out["drive_read_gbps_runs"] = drive["read"]
    out["drive_write_gbps_runs"] = drive["write"]
    out["io_bound_seconds"] = (out["bytes_read_per_iteration"] / (out["drive_read_gbps"] * 1e9)
                               + out["bytes_written_per_iteration"]
                               / (out["drive_write_gbps"] * 1e9))
    out["io_bound_ratio"] = out["offloaded_iteration_seconds"] / out["io_bound_seconds"]
    out["io_bound_over_in_memory"] = out["io_bound_seconds"] / out[
        "in_memory_iteration_seconds"]
    out["io_bound_throughput_ratio"] = (out["in_memory_iteration_seconds"]
                                        / out["io_bound_seconds"])
    out["drive_allows_0_8"] = out["io_bound_throughput_ratio"] >= 0.8
    out["resident_working_set_bytes"] = final["resident"]["working_set_bytes"]
    out["resident_peak_working_set_bytes"] = final["resident"]["peak_working_set_bytes"]
    out["resident_bytes_fetched"] = int(m("bytes_fetched", r))
    out["resident_prefetch_misses"] = int(m("prefetch_misses", r))
    for name, role in (("", "offload"), ("in_memory_", "memory"), ("resident_", "resident")):
        out[f"{name}peak_rss_bytes"] = final[role]["vm_hwm"]
        out[f"{name}peak_rss_bytes_since_start"] = final[role]["vm_hwm_since_start"]
    out["peak_rss_reset"] = all(x["hwm_reset"] for x in resets.values())
    out["release_memory"] = args.release_memory
    out["mmap_threshold_fixed"] = final["offload"]["mmap_threshold_fixed"]
    out["resident_mmap_threshold_fixed"] = final["resident"]["mmap_threshold_fixed"]
    out["working_set_bytes"] = final["offload"]["working_set_bytes"]
    out["peak_working_set_bytes"] = final["offload"]["peak_working_set_bytes"]
    out["steps_skipped"] = sum(x["step_skipped"] for x in a + r)
    out["losses_offloaded"] = [x["loss"] for x in a]
    out["losses_in_memory"] = [x["loss"] for x in b]
    out["losses_resident"] = [x["loss"] for x in r]
    out["children_ok"] = True
    return out


def size_arg(text: str) -> int:
    import strata
    n = strata.parse_size(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 bytes, got {text!r}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="main", help="examples/train_offload.py's model "
                    "preset: main (default), tiny, large")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations each (default 5)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed iterations each first (default 2; the first traces)")
    ap.add_argument("--working-set", default=None,
                    help="parameter working set (bytes or 64MiB; default: the preset's)")
    ap.add_argument("--arithmetic", choices=["simd", "torch"], default="simd")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads per child (default: the CPU count)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0,
                    help="gradient clipping's max norm (default 1.0; 0 = no clipping)")
    ap.add_argument("--overlap-backward", action="store_true",
                    help="the offloaded runs' OffloadAdamW with overlap_backward=True (the "
                    "update during backward)")
    ap.add_argument("--resident-working-set", type=size_arg, default=None,
                    help="the resident run's working set (bytes or 1GiB, at least the "
                    "model's parameter bytes; default twice those)")
    ap.add_argument("--release-memory", choices=["auto", "true", "false"], default="auto",
                    help="offload_parameters' release_memory for the offloaded runs: auto "
                    "(default: None, glibc's mmap threshold fixed only when the training "
                    "state exceeds the memory available), true, false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--corpus-bytes", type=int, default=1 << 20)
    ap.add_argument("--path", default=None, help="directory under which the store and the "
                    "fio file go (in a new subdirectory, removed at exit; default: under "
                    "strata.default_data_dir())")
    ap.add_argument("--fio-size", type=size_arg, default="1GiB",
                    help="fio's file size (default 1GiB)")
    ap.add_argument("--fio-seconds", type=float, default=3.0,
                    help="seconds per fio run (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(json.loads(args.child))
    args.release_memory = {"auto": None, "true": True, "false": False}[args.release_memory]
    if args.preset not in PRESETS:
        ap.error(f"--preset: one of {sorted(PRESETS)}, got {args.preset!r}")
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    for name in ("iters", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.warmup < 1:
        ap.error(f"--warmup: must be >= 1 (the first iteration traces), got {args.warmup}")
    if not args.max_grad_norm >= 0:
        ap.error(f"--max-grad-norm: must be >= 0 (0 = no clipping), got {args.max_grad_norm}")
    if args.fio_seconds <= 0:
        ap.error(f"--fio-seconds: must be > 0, got {args.fio_seconds}")
    import strata
    parent = args.path or strata.default_data_dir()
    os.makedirs(parent, exist_ok=True)
    base = tempfile.mkdtemp(prefix="bench-param-offload-", dir=parent)
    # SIGTERM/SIGHUP as SystemExit, so the finally below removes the store and fio file
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    try:
        out = run(args, base)
    except (ChildFailed, RuntimeError, ValueError) as e:
        print(f"param_offload bench: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:40s} {v:.4f}" if isinstance(v, float) else f"{k:40s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
