#!/usr/bin/python3
"""strata's main job: trains a GPT-style language model whose parameters, gradients and
optimizer state are several times the memory the training process may use, with the
model's code unchanged (strata.torch.offload_parameters + OffloadAdamW), and checks it
against torch.

Three runs, each in its own process, of the same model (examples/train_lm.py's GPT: token
and position embeddings, pre-LayerNorm blocks, tied head), from the same seed on the same
batches of the Python standard library's sources:

  1. offloaded, under a memory cgroup of --memory-limit bytes that this script creates
     (examples/memory_limit.py; root): parameters in a strata store (nvme tier, under
     --dir), materialized in a --working-set budget during forward and backward, Adam
     moments in the store, each fp32 parameter's store object its optimizer's master,
     updated by OffloadAdamW(overlap_backward=True) with torch's exact rounding inside
     backward as each gradient becomes final (a step that clipping scales is redone from
     the gradients, which go to the store for that: max_grad_norm=; after a clipped step
     the next one is stepped after backward, docs/offload.md);
  2. torch.optim.AdamW with everything in memory, without the limit (the reference);
  3. the same in-memory torch training under the same limit: killed by the kernel's OOM
     killer, which shows the limit is real (skip with --no-oom-demo).

It prints the model size, the training state size (what torch needs in memory: fp32
parameters, gradients and the two Adam moments, 16 bytes per parameter), the limit, each
run's per-step loss and time and its peak memory (the cgroup's peak charge and the
process's VmHWM), the parameter offload's counters, and before the last line the offloaded
step's time over the in-memory one, its steady prefetch (misses, hits, stall / fetch of the
steps after the first, summed) and its I/O bound: the bytes it moves from and to the
store (store_bytes()) over the drive's read and write bandwidth given by --drive-read-gbps
and --drive-write-gbps (scripts/main.sh passes those ``strata bench io`` measured just
before, on the same directory; medians over the steps after the first). The last line is
``OK`` only when runs 1 and 2 agree bit for bit (every step's loss and every final
parameter's bytes) and run 3 was killed for memory; ``FAIL: ...`` otherwise (exit status 1).

    PYTHONPATH=build/python /usr/bin/python3 examples/train_offload.py             # main job
    ... --preset large --dir /nvme/strata     # parameters + gradients + Adam state > 24 GiB
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: model presets: layers, d_model, heads, context, batch, steps, limit, working set
PRESETS = {
    # 11 x 12.6 M + embeddings = 138.7 M parameters: 2.07 GiB of training state, 4.1 x 512 MiB
    "main": dict(layers=11, d_model=1024, heads=8, context=32, batch=1, steps=4,
                 memory_limit="512MiB", working_set="64MiB"),
    # 21 x 78.7 M = 1.65 G parameters: 24.6 GiB of training state (+ 6.2 GiB of fp32 masters);
    # 8 x 32 tokens per step: with 32, a layer's forward (5 GFLOP) is shorter than the fetch
    # of its 315 MB, so forward waits for the drive whatever the prefetch (docs/offload.md)
    "large": dict(layers=21, d_model=2560, heads=20, context=32, batch=8, steps=3,
                  memory_limit="3GiB", working_set="512MiB", reference=False),
    # for tests: 1.6 M parameters
    "tiny": dict(layers=2, d_model=256, heads=4, context=32, batch=2, steps=3,
                 memory_limit="384MiB", working_set="2MiB"),
}


def parse_size(text: str) -> int:
    import strata
    return strata.parse_size(text)


def build(args):
    """The corpus batches and the model (same seed in every run)."""
    import torch
    from train_lm import GPT, Batches, load_corpus
    torch.manual_seed(args.seed)
    text = load_corpus(args.corpus, args.corpus_bytes)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    model = GPT(len(chars), args.d_model, args.layers, args.heads, args.context)
    return model, Batches(data, args.context, args.batch, args.seed + 1), len(chars)


#: the counters of store_bytes(): bytes an offloaded iteration reads from the store ...
READ_COUNTERS = ("bytes_fetched", "grad_bytes_read", "optimizer_bytes_read")
#: ... and writes to it
WRITE_COUNTERS = ("grad_bytes_written", "bytes_written_back", "param_bytes_written",
                  "optimizer_bytes_written")


def store_bytes(handle, opt) -> dict:
    """The bytes an offloaded training has moved from and to its store so far (cumulative
    counters, bytes, keyed by READ_COUNTERS and WRITE_COUNTERS; take the difference of two
    calls for an iteration). From the ParameterOffload ``handle``'s stats(): parameters
    fetched in forward and backward (``bytes_fetched``), gradients written in backward and
    read by the step (``grad_bytes_written`` / ``grad_bytes_read``), edited parameters
    stored (``bytes_written_back``), parameter values stored by the step
    (``param_bytes_written``); from the strata optimizer ``opt``'s stats() (every step
    of its C++ optimizer, those run during backward too): the fp32 masters and moments its
    pipeline read and wrote (``optimizer_bytes_read`` / ``optimizer_bytes_written``). No
    byte is in two of them: the pipeline takes the gradients and gives the updated values
    in memory."""
    st, ot = handle.stats(), opt.stats()
    out = {k: int(st[k]) for k in READ_COUNTERS + WRITE_COUNTERS
           if not k.startswith("optimizer_")}
    out["optimizer_bytes_read"] = int(ot["bytes_read"])
    out["optimizer_bytes_written"] = int(ot["bytes_written"])
    return out


def bytes_moved(before: dict, after: dict) -> dict:
    """Two store_bytes() snapshots' difference: every counter's, and their sums ``read``
    and ``written`` (bytes)."""
    out = {k: after[k] - before[k] for k in READ_COUNTERS + WRITE_COUNTERS}
    out["read"] = sum(out[k] for k in READ_COUNTERS)
    out["written"] = sum(out[k] for k in WRITE_COUNTERS)
    return out


def prefetch_stats(handle) -> dict:
    """The ParameterOffload ``handle``'s prefetch counters now: misses (fetches a module
    waited for that no prefetch had issued), hits, and stall and fetch times (seconds);
    the difference of two snapshots is one step's."""
    st = handle.stats()
    return {k: st[k] for k in ("prefetch_misses", "prefetch_hits", "stall_seconds",
                               "fetch_seconds")}


def vm_hwm() -> int:
    """This process's peak resident set (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def run_child(args) -> None:
    """One run (--role offload | torch); its result as JSON in --result."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    from train_lm import param_groups
    handle = opt = store = None
    if args.role == "offload":
        import strata
        import strata.torch as st
        store = strata.Store.open(args.dir, host_budget="16MiB", staging="16MiB",
                                  chunk_size="1MiB", durability="flush")
        # the model is built with its parameters going to the store as they are made
        with st.offload_init(store, working_set=args.working_set) as handle:
            model, batches, vocab = build(args)
        handle.attach(model, overwrite=True)
        opt = st.OffloadAdamW(param_groups(model, args.weight_decay), lr=args.lr,
                              store=store, arithmetic="torch", overwrite=True,
                              overlap_backward=True, max_grad_norm=args.max_grad_norm)
        handle.reset_stats()  # count the training, not the construction's initialization
    else:
        model, batches, vocab = build(args)
        opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr)
    losses, seconds, moved, prefetch = [], [], [], []
    for step in range(args.steps):
        x, y = batches.next()
        if handle is not None:
            before = store_bytes(handle, opt)
            fetch_before = prefetch_stats(handle)
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
        loss.backward()
        if handle is None and args.max_grad_norm > 0:  # strata's: max_grad_norm= (the same
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # rule)
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - t0)
        if handle is not None:
            moved.append(bytes_moved(before, store_bytes(handle, opt)))
            fetch_after = prefetch_stats(handle)
            prefetch.append({k: fetch_after[k] - fetch_before[k] for k in fetch_after})
        losses.append(loss.item())
        print(f"  [{args.role}] step {step + 1}/{args.steps}: loss {losses[-1]:.6f}, "
              f"{seconds[-1]:.2f} s", flush=True)
    result = dict(losses=losses, seconds=seconds)
    if handle is not None:
        result["bytes_moved"] = moved
        result["prefetch"] = prefetch
        result["stats"] = handle.stats()
        result["digests"] = {n: digest(handle.read(p)) for n, p in handle.parameters}
        opt.close()
        handle.close(restore=False)
        store.close()
    else:
        result["digests"] = {n: digest(p) for n, p in model.named_parameters()}
    result["vm_hwm_bytes"] = vm_hwm()
    with open(args.result, "w") as f:
        json.dump(result, f)


def child_argv(args, role: str, result: str):
    argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--result", result]
    for k in ("layers", "d_model", "heads", "context", "batch", "steps", "lr",
              "weight_decay", "max_grad_norm", "seed", "threads", "corpus", "corpus_bytes",
              "working_set", "dir"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="main",
                    help="model and limits (default main; flags below override)")
    for k in ("layers", "d_model", "heads", "context", "batch", "steps"):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--memory-limit", default=None, help="the cgroup's limit (bytes or 512MiB)")
    ap.add_argument("--working-set", default=None, help="parameter working set (bytes or 64MiB)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--corpus", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--corpus-bytes", type=int, default=1 << 20)
    ap.add_argument("--dir", default=None, help="store directory (default: under $STRATA_DIR)")
    ap.add_argument("--drive-read-gbps", type=float, default=None,
                    help="the drive's read bandwidth, GB/s (scripts/main.sh passes strata "
                    "bench io's): the I/O bound of the offloaded step is printed")
    ap.add_argument("--drive-write-gbps", type=float, default=None,
                    help="the drive's write bandwidth, GB/s (as --drive-read-gbps)")
    ap.add_argument("--no-oom-demo", action="store_true",
                    help="skip run 3 (in-memory torch under the limit)")
    ap.add_argument("--no-reference", action="store_true",
                    help="run 1 only (preset large: its in-memory runs cannot fit in RAM)")
    ap.add_argument("--allow-small", action="store_true",
                    help="do not insist on a state of at least 4 x the limit")
    ap.add_argument("--role", choices=["offload", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("drive_read_gbps", "drive_write_gbps"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            ap.error(f"--{name.replace('_', '-')}: must be > 0, got {v}")
    if (args.drive_read_gbps is None) != (args.drive_write_gbps is None):
        ap.error("--drive-read-gbps and --drive-write-gbps go together")
    preset = dict(PRESETS[args.preset])
    reference = preset.pop("reference", True) and not args.no_reference
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.role:
        run_child(args)
        return 0

    from memory_limit import MemoryLimit, MemoryLimitUnavailable
    import strata
    limit = parse_size(str(args.memory_limit))
    made_dir = args.dir is None
    if made_dir:
        args.dir = tempfile.mkdtemp(prefix="train-offload-", dir=strata.default_data_dir())
    from train_lm import load_corpus
    vocab = len(set(load_corpus(args.corpus, args.corpus_bytes)))
    d = args.d_model  # GPT's parameters: tied token table, positions, blocks, final LayerNorm
    n_params = vocab * d + args.context * d + args.layers * (12 * d * d + 13 * d) + 2 * d
    state = 16 * n_params
    print(f"model: GPT, {args.layers} layers x d_model {args.d_model}, vocab {vocab}: "
          f"{n_params:,} parameters ({gib(4 * n_params)} fp32)")
    print(f"training state (fp32 parameters + gradients + Adam moments, as torch holds "
          f"them): {gib(state)}; strata also keeps fp32 masters: {gib(20 * n_params)} on NVMe")
    print(f"memory limit of the offloaded run (memory cgroup): {mib(limit)}: state / limit "
          f"= {state / limit:.2f}; working set {args.working_set}")
    failures = []
    if state < 4 * limit and not args.allow_small:
        failures.append(f"state {gib(state)} < 4 x limit {mib(limit)}")
    results = {}
    tmp = tempfile.mkdtemp(prefix="train-offload-results-")
    try:
        try:
            with MemoryLimit(limit) as lim:
                out = os.path.join(tmp, "offload.json")
                print(f"run 1: offloaded (strata), under the {mib(limit)} limit", flush=True)
                t0 = time.perf_counter()
                rc = lim.run(child_argv(args, "offload", out))
                results["offload"] = _load(out, rc, "run 1")
                results["offload"]["cgroup_peak"] = lim.peak_bytes()
                results["offload"]["wall"] = time.perf_counter() - t0
        except MemoryLimitUnavailable as e:
            print(f"main job: {e}", file=sys.stderr)
            return 1
        if reference:
            print("run 2: torch.optim.AdamW, everything in memory, no limit", flush=True)
            out = os.path.join(tmp, "torch.json")
            t0 = time.perf_counter()
            rc = subprocess.call(child_argv(args, "torch", out))
            results["torch"] = _load(out, rc, "run 2")
            results["torch"]["wall"] = time.perf_counter() - t0
        if reference and not args.no_oom_demo:
            print(f"run 3: the same in-memory torch training under the {mib(limit)} limit",
                  flush=True)
            with MemoryLimit(limit) as lim:
                rc = lim.run(child_argv(args, "torch", os.path.join(tmp, "oom.json")),
                             stdout=subprocess.DEVNULL)
                killed = lim.oom_killed()
            print(f"  exit status {rc}, OOM kills {killed}")
            if not (rc == -9 and killed > 0):
                failures.append(f"in-memory torch under the limit was not killed for memory "
                                f"(exit status {rc}, oom_kill {killed})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if made_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    for name in ("offload", "torch"):
        if "error" in results.get(name, {}):
            failures.append(results[name]["error"])
    if not failures:
        a = results["offload"]
        st = a["stats"]
        print(f"offloaded: peak memory {mib(a['cgroup_peak'])} (cgroup), VmHWM "
              f"{mib(a['vm_hwm_bytes'])}; {sum(a['seconds']) / len(a['seconds']):.2f} s/step; "
              f"fetched {gib(st['bytes_fetched'])} ({st['prefetch_hits']} prefetch hits, "
              f"{st['prefetch_misses']} misses, stalled {st['stall_seconds']:.2f} of "
              f"{st['fetch_seconds']:.2f} s of fetch), peak working set "
              f"{mib(st['peak_working_set_bytes'])}")
        if not reference:
            print(f"final loss: offloaded {a['losses'][-1]!r} (no in-memory reference)")
            ok = all(math.isfinite(x) for x in a["losses"])
            if ok:
                print(step_summary(args, n_params, a, None))
            print("OK" if ok else "FAIL: a loss is not finite")
            return 0 if ok else 1
        b = results["torch"]
        print(f"in memory: VmHWM {mib(b['vm_hwm_bytes'])}; "
              f"{sum(b['seconds']) / len(b['seconds']):.2f} s/step")
        print(f"final loss: offloaded {a['losses'][-1]!r}, torch {b['losses'][-1]!r}")
        if a["losses"] != b["losses"]:
            failures.append(f"losses differ: {a['losses']} vs {b['losses']}")
        diff = [n for n in b["digests"] if a["digests"].get(n) != b["digests"][n]]
        if diff:
            failures.append(f"{len(diff)} parameters differ (first: {diff[0]})")
        else:
            print(f"all {len(b['digests'])} parameters bit-identical")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print(step_summary(args, n_params, results["offload"], results["torch"]))
    print("OK")
    return 0


def steady(values: list) -> list:
    """The steps after the first (which traces the parameters' order of use and creates
    the optimizer's state), or the only one."""
    return values[1:] or values


def step_summary(args, n_params: int, a: dict, b) -> str:
    """The lines printed before ``OK``: the offloaded step's time over the in-memory one
    (``b``, None without the in-memory run), and the offloaded step's I/O bound, the bytes
    it moved over the drive bandwidth given by --drive-read-gbps / --drive-write-gbps
    (seconds; medians over the steps after the first)."""
    med = statistics.median
    t = med(steady(a["seconds"]))
    n = len(a["seconds"])
    steps = f"median of steps 2-{n}" if n > 2 else ("step 2" if n == 2 else "step 1")
    lines = []
    if b is not None:
        tm = med(steady(b["seconds"]))
        lines.append(f"offloaded / in-memory step time: {t / tm:.2f} ({t:.2f} s / {tm:.2f} s, "
                     f"{steps})")
    if a.get("prefetch"):
        pf = steady(a["prefetch"])
        fetch = sum(x["fetch_seconds"] for x in pf)
        stall = sum(x["stall_seconds"] for x in pf)
        lines.append(f"steady prefetch ({steps.replace('median of ', '')}): "
                     f"{sum(x['prefetch_misses'] for x in pf)} misses, "
                     f"{sum(x['prefetch_hits'] for x in pf)} hits, stalled {stall:.2f} of "
                     f"{fetch:.2f} s of fetch (stall/fetch {stall / fetch if fetch else 0:.2f})")
    rd = med(x["read"] for x in steady(a["bytes_moved"]))
    wr = med(x["written"] for x in steady(a["bytes_moved"]))
    moved = (f"{(rd + wr) / 1e9:.2f} GB moved per step: read {rd / 1e9:.2f} GB "
             f"({rd / n_params:.1f} B/parameter), written {wr / 1e9:.2f} GB "
             f"({wr / n_params:.1f} B/parameter)")
    if args.drive_read_gbps is None:
        lines.append(f"offloaded step: {moved}; no drive bandwidth given "
                     "(--drive-read-gbps, --drive-write-gbps), so no I/O bound")
    else:
        bound = rd / (args.drive_read_gbps * 1e9) + wr / (args.drive_write_gbps * 1e9)
        lines.append(f"I/O bound of the offloaded step: {bound:.2f} s ({moved}; drive read "
                     f"{args.drive_read_gbps:.2f}, write {args.drive_write_gbps:.2f} GB/s); "
                     f"offloaded step / I/O bound {t / bound:.2f}")
    return "\n".join(lines)


def _load(path: str, rc: int, what: str) -> dict:
    if rc != 0 or not os.path.exists(path):
        return {"error": f"{what} failed (exit status {rc})"}
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
