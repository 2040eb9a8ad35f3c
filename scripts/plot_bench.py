#!/usr/bin/python3
"""Turns the benchmark JSON in docs/data/ into the PNG charts in docs/img/.

Usage: /usr/bin/python3 scripts/plot_bench.py [--data DIR] [--out DIR] [NAME ...]

Reads DIR/<name>.json (default docs/data) for each chart below that has its file, writes
OUT/<name>.png (default docs/img), prints one line per chart ("wrote PATH" or "skipped NAME:
why"), and exits 1 when a file is malformed (the message names the file and the field at
fault), 0 otherwise. NAME restricts the run to those charts. Needs matplotlib (Debian 12:
python3-matplotlib; scripts/install-deps.sh installs it).

Every file is one JSON object with a "results" list (the rows) and optional "command" and
"machine" strings (shown in docs/benchmarks.md, not on the charts). Row fields by chart:

  io_sweep            rows are `strata bench io --json` objects: op ("read"/"write"),
                      block_size (bytes), queue_depth, gbps (1e9 B/s). Several rows with the
                      same (op, block_size, queue_depth) are repeats: the chart shows their
                      median, with bars from the lowest to the highest. Optional "limits": rows
                      of the same fields from fio (plotted as crosses, medians).
  adam_threads        rows are `strata bench adam --json` objects: threads, numel,
                      seconds_per_step, mem_limit_seconds_per_step (the streaming probe of the
                      same shape, same run). Repeats per thread count: medians.
  step_breakdown      rows are `strata bench step --json` objects: params, buffers,
                      step_seconds, io_seconds, compute_seconds, overlap_efficiency,
                      last_step_update_seconds, last_step_io_wait_seconds; optional label.
                      Rows of one configuration (label, else params + buffers) are repeats:
                      medians of each figure. The step's bar is split into its last timed
                      step's update time, I/O wait and the rest.
  emulated_scaling    rows (from `strata bench partitioned-read --emulated-drive-bw B --json`):
                      nproc, aggregate_gbps, per_drive_gbps, and the emulated drive's
                      bandwidth as emulated_drive_gbps (1e9 B/s) or
                      emulated_drive_bw_bytes_per_s (the row's or the file's top level).
  planner_accuracy    rows: label, predicted, measured (the same unit), unit ("s", "GB/s");
                      or predicted_seconds / measured_seconds (bench/planner_accuracy.py;
                      label or config) or predicted_step_seconds / measured_step_seconds.

Thread-safety: a script, one process. Formulae: medians (statistics.median); the Adam
throughput is numel / seconds_per_step (parameters per second).
"""

import argparse
import json
import os
import statistics
import sys


class DataError(Exception):
    """A benchmark file that cannot be charted; the message names the file and the field."""


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")
    if isinstance(doc, list):
        doc = {"results": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise DataError(f"{path}: expected an object with a \"results\" list")
    if not doc["results"]:
        raise DataError(f"{path}: \"results\" is empty")
    for i, row in enumerate(doc["results"]):
        if not isinstance(row, dict):
            raise DataError(f"{path}: results[{i}] is not an object")
    return doc


def field(path, i, row, name, kind=float, where="results"):
    """row[name] (row i of list `where`) as a number (kind float or int) or a string (str)."""
    at = f"{path}: {where}[{i}]"
    if name not in row:
        raise DataError(f"{at} has no \"{name}\"")
    v = row[name]
    if kind is str:
        if not isinstance(v, str):
            raise DataError(f"{at}.{name} is not a string: {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DataError(f"{at}.{name} is not a number: {v!r}")
    if kind is int and v != int(v):
        raise DataError(f"{at}.{name} is not an integer: {v!r}")
    return kind(v)


def size_label(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def new_figure(plt, ncols=1, width=6.4, height=4.2):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, axes[0]


def plot_io_sweep(plt, path, doc):
    groups = {}
    for i, row in enumerate(doc["results"]):
        op = field(path, i, row, "op", str)
        if op not in ("read", "write"):
            raise DataError(f"{path}: results[{i}].op is {op!r}, expected read or write")
        key = (op, field(path, i, row, "queue_depth", int), field(path, i, row, "block_size", int))
        groups.setdefault(key, []).append(field(path, i, row, "gbps"))
    limits = {}
    rows = doc.get("limits", [])
    if not isinstance(rows, list):
        raise DataError(f"{path}: \"limits\" is not a list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: limits[{i}] is not an object")
        key = (field(path, i, row, "op", str, "limits"),
               field(path, i, row, "queue_depth", int, "limits"),
               field(path, i, row, "block_size", int, "limits"))
        limits.setdefault(key, []).append(field(path, i, row, "gbps", float, "limits"))
    ops = [op for op in ("read", "write") if any(k[0] == op for k in groups)]
    fig, axes = new_figure(plt, len(ops), 5.2)
    top = max(max(v) for v in list(groups.values()) + list(limits.values())) * 1.45
    for ax, op in zip(axes, ops):
        for qd in sorted({k[1] for k in groups if k[0] == op}):
            pts = sorted((k[2], statistics.median(v), min(v), max(v)) for k, v in groups.items()
                         if k[0] == op and k[1] == qd)
            # Bars: the lowest and highest repeat (the spread of a shared machine).
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                        yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        marker="o", capsize=3, label=f"queue depth {qd}")
        lim = sorted((bs, statistics.median(v)) for (o, qd, bs), v in limits.items() if o == op)
        if lim:
            qds = sorted({k[1] for k in limits if k[0] == op})
            ax.plot([p[0] for p in lim], [p[1] for p in lim], linestyle="none", marker="x",
                    color="black", markersize=9,
                    label=f"fio, same file (queue depth {', '.join(map(str, qds))})")
        ticks = sorted({k[2] for k in groups if k[0] == op})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks], rotation=30)
        ax.minorticks_off()
        ax.set_ylim(0, top)
        ax.set_xlabel("block size (bytes per request)")
        ax.set_ylabel("bandwidth (GB/s, 1e9 B/s)")
        ax.set_title(f"strata bench io: sequential {op}, O_DIRECT\n(median; bars: min-max of "
                     "the repeats)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def plot_adam_threads(plt, path, doc):
    by_t = {}
    for i, row in enumerate(doc["results"]):
        t = field(path, i, row, "threads", int)
        n = field(path, i, row, "numel")
        s = field(path, i, row, "seconds_per_step")
        lim = field(path, i, row, "mem_limit_seconds_per_step")
        if s <= 0 or lim <= 0:
            raise DataError(f"{path}: results[{i}]: seconds_per_step and "
                            "mem_limit_seconds_per_step must be > 0")
        by_t.setdefault(t, ([], [], []))
        by_t[t][0].append(n / s / 1e6)
        by_t[t][1].append(n / lim / 1e6)
        by_t[t][2].append(lim / s)  # this run's fraction of the limit measured beside it
    ts = sorted(by_t)
    adam = [statistics.median(by_t[t][0]) for t in ts]
    limit = [statistics.median(by_t[t][1]) for t in ts]
    fig, (ax,) = new_figure(plt)
    ax.errorbar(ts, adam, yerr=[[a - min(by_t[t][0]) for t, a in zip(ts, adam)],
                                [max(by_t[t][0]) - a for t, a in zip(ts, adam)]],
                marker="o", capsize=3, label="Adam step (strata bench adam; bars: min-max)")
    ax.plot(ts, limit, marker="s", linestyle="--",
            label="memory-bandwidth limit (streaming probe, same run)")
    for t, a in zip(ts, adam):
        ax.annotate(f"{statistics.median(by_t[t][2]):.0%}", (t, a), textcoords="offset points",
                    xytext=(8, -14), fontsize=8)
    ax.set_xticks(ts)
    ax.set_ylim(0, max(limit + [max(v[0]) for v in by_t.values()]) * 1.15)
    ax.set_xlabel("kernel threads (--threads)")
    ax.set_ylabel("throughput (million fp32 parameters / s)")
    ax.set_title("CPU Adam throughput vs threads\n(medians; labels: median fraction of the limit)",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_step_breakdown(plt, path, doc):
    keys = ("step_seconds", "io_seconds", "compute_seconds", "overlap_efficiency",
            "last_step_update_seconds", "last_step_io_wait_seconds")
    groups = {}  # label -> {key: [values of the repeats]}, in first-seen order
    for i, row in enumerate(doc["results"]):
        label = row.get("label")
        if label is None:
            label = (f"{field(path, i, row, 'params') / 1e6:g}M params\n"
                     f"{field(path, i, row, 'buffers', int)} buffers")
        elif not isinstance(label, str):
            raise DataError(f"{path}: results[{i}].label is not a string: {label!r}")
        g = groups.setdefault(label, {k: [] for k in keys})
        for k in keys:
            g[k].append(field(path, i, row, k))
    # Repeats of one configuration: the median of each figure.
    rows = [dict(label=lab, n=len(g["step_seconds"]),
                 **{k: statistics.median(v) for k, v in g.items()}) for lab, g in groups.items()]
    for r in rows:
        if r["n"] > 1:
            r["label"] += f"\n(median of {r['n']})"
    fig, (ax,) = new_figure(plt, width=max(6.4, 2.2 * len(rows) + 1.5))
    w = 0.26
    xs = range(len(rows))
    ax.bar([x - w for x in xs], [r["io_seconds"] for r in rows], w, color="tab:blue",
           label="I/O alone (engine, same bytes)")
    ax.bar(list(xs), [r["compute_seconds"] for r in rows], w, color="tab:orange",
           label="compute alone (Adam kernel, in memory)")
    upd = [r["last_step_update_seconds"] for r in rows]
    wait = [r["last_step_io_wait_seconds"] for r in rows]
    # The step's own time split (its last step): update, waiting for I/O, the rest.
    rest = [max(0.0, r["step_seconds"] - u - q) for r, u, q in zip(rows, upd, wait)]
    sx = [x + w for x in xs]
    ax.bar(sx, upd, w, color="tab:green", label="step: updating")
    ax.bar(sx, wait, w, bottom=upd, color="tab:red", label="step: waiting for I/O")
    ax.bar(sx, rest, w, bottom=[u + q for u, q in zip(upd, wait)], color="tab:gray",
           label="step: other")
    for x, r in zip(sx, rows):
        top = max(r["step_seconds"], r["last_step_update_seconds"] + r["last_step_io_wait_seconds"])
        ax.annotate(f"step {r['step_seconds']:.2f} s\noverlap {r['overlap_efficiency']:.2f}",
                    (x, top), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["label"] for r in rows])
    highest = max(max(r["io_seconds"], r["compute_seconds"], r["step_seconds"],
                      r["last_step_update_seconds"] + r["last_step_io_wait_seconds"]) for r in rows)
    ax.set_ylim(0, highest * 1.35)
    ax.set_ylabel("seconds per step (medians)")
    ax.set_title("Offloaded Adam step (state on NVMe): step vs its two limits\n"
                 "overlap = max(I/O alone, compute alone) / step", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def drive_gbps(path, i, row, doc):
    for src in (row, doc):
        if "emulated_drive_gbps" in src:
            return field(path, i, src, "emulated_drive_gbps")
        for name in ("emulated_drive_bw_bytes_per_s", "emulated_drive_bw"):
            if name in src:
                return field(path, i, src, name) / 1e9
    return None


def plot_emulated_scaling(plt, path, doc):
    by_n = {}
    ideal = {}
    for i, row in enumerate(doc["results"]):
        n = field(path, i, row, "nproc", int)
        by_n.setdefault(n, ([], []))
        by_n[n][0].append(field(path, i, row, "aggregate_gbps"))
        by_n[n][1].append(field(path, i, row, "per_drive_gbps"))
        b = drive_gbps(path, i, row, doc)
        if b is not None:
            ideal[n] = n * b
    ns = sorted(by_n)
    agg = [statistics.median(by_n[n][0]) for n in ns]
    per = [statistics.median(by_n[n][1]) for n in ns]
    # Speedups over one rank of what else the rows measured (bench/store/emulated_scaling.py:
    # the offloaded step and the ZeRO-3 parameter fetch): a second panel when present.
    speedups = {}
    for name, label in (("step_speedup", "offloaded Adam step"),
                        ("param_fetch_speedup", "ZeRO-3 parameter fetch")):
        if all(name in row for row in doc["results"]):
            by = {field(path, i, row, "nproc", int): field(path, i, row, name)
                  for i, row in enumerate(doc["results"])}
            speedups[label] = [by[n] for n in ns]
    fig, axes = new_figure(plt, ncols=2 if speedups else 1)
    ax = axes[0]
    ax.plot(ns, agg, marker="o", label="aggregate read (all ranks)")
    ax.plot(ns, per, marker="^", label="per drive")
    if len(ideal) == len(ns):
        ax.plot(ns, [ideal[n] for n in ns], linestyle="--", color="gray", label="N x drive bandwidth")
        ax.plot(ns, [0.9 * ideal[n] for n in ns], linestyle=":", color="gray", label="goal 0.9 x N x B")
    ax.set_xticks(ns)
    ax.set_ylim(0, max(agg + per + list(ideal.values())) * 1.15)
    ax.set_xlabel("ranks = emulated drives (nproc)")
    ax.set_ylabel("read bandwidth (GB/s, 1e9 B/s)")
    ax.set_title("Partitioned read over emulated drives\n(throttled loop devices, medians)",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if speedups:
        ax = axes[1]
        ax.plot(ns, ns, linestyle="--", color="gray", label="ideal (N)")
        for (label, ys), marker in zip(speedups.items(), ("s", "D")):
            ax.plot(ns, ys, marker=marker, label=label)
        ax.set_xticks(ns)
        ax.set_ylim(0, max(ns + [y for ys in speedups.values() for y in ys]) * 1.15)
        ax.set_xlabel("ranks = emulated drives (nproc)")
        ax.set_ylabel("speedup over 1 rank (x)")
        ax.set_title("Same drives: step time and parameter fetch\n(speedup over N = 1)",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_planner_accuracy(plt, path, doc):
    rows = []
    for i, row in enumerate(doc["results"]):
        if "predicted" in row or "measured" in row:
            p, m = field(path, i, row, "predicted"), field(path, i, row, "measured")
            unit = field(path, i, row, "unit", str)
        elif "predicted_seconds" in row:  # bench/planner_accuracy.py's rows
            p = field(path, i, row, "predicted_seconds")
            m = field(path, i, row, "measured_seconds")
            unit = "s"
        else:
            p = field(path, i, row, "predicted_step_seconds")
            m = field(path, i, row, "measured_step_seconds")
            unit = "s"
        if m <= 0:
            raise DataError(f"{path}: results[{i}]: the measured value must be > 0")
        label = row["label"] if "label" in row else field(path, i, row, "config", str)
        if not isinstance(label, str):
            raise DataError(f"{path}: results[{i}].label is not a string: {label!r}")
        rows.append((label, p, m, unit))
    fig, (ax,) = new_figure(plt, width=7.2, height=max(3.0, 0.45 * len(rows) + 1.8))
    ys = list(range(len(rows)))[::-1]
    ratios = [p / m for _, p, m, _ in rows]
    ax.axvspan(0.8, 1.2, color="tab:green", alpha=0.12, label="within 20%")
    ax.axvline(1.0, color="gray", linewidth=1)
    ax.barh(ys, ratios, color=["tab:blue" if 0.8 <= r <= 1.2 else "tab:red" for r in ratios],
            height=0.55)
    for y, (label, p, m, unit), r in zip(ys, rows, ratios):
        ax.annotate(f"{p:.3g} / {m:.3g} {unit}", (r, y), textcoords="offset points",
                    xytext=(4, -3), fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([r[0] for r in rows], fontsize=8)
    ax.set_xlim(0, max(1.5, max(ratios) * 1.4))
    ax.set_xlabel("predicted / measured (1 = exact; labels: predicted / measured)")
    ax.set_title("strata plan vs measurement")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


CHARTS = {
    "io_sweep": plot_io_sweep,
    "adam_threads": plot_adam_threads,
    "step_breakdown": plot_step_breakdown,
    "emulated_scaling": plot_emulated_scaling,
    "planner_accuracy": plot_planner_accuracy,
}


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(root, "docs", "data"),
                    help="directory of <name>.json (default docs/data)")
    ap.add_argument("--out", default=os.path.join(root, "docs", "img"),
                    help="directory for <name>.png (default docs/img)")
    ap.add_argument("names", nargs="*", metavar="NAME", help=", ".join(CHARTS))
    args = ap.parse_args(argv)
    for n in args.names:
        if n not in CHARTS:
            ap.error(f"unknown chart {n!r}: expected one of {', '.join(CHARTS)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench.py: matplotlib is not installed (Debian: apt-get install "
              "python3-matplotlib)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    failed = False
    for name in args.names or CHARTS:
        src = os.path.join(args.data, name + ".json")
        if not os.path.exists(src):
            print(f"skipped {name}: {src} not found")
            continue
        try:
            fig = CHARTS[name](plt, src, load(src))
        except DataError as e:
            print(f"plot_bench.py: {e}", file=sys.stderr)
            failed = True
            continue
        dst = os.path.join(args.out, name + ".png")
        fig.tight_layout()
        fig.savefig(dst, dpi=110, metadata={"Software": None})
        plt.close(fig)
        print(f"wrote {dst}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
