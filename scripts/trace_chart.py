#!/usr/bin/python3
"""Draws one iteration of a strata.torch trace (STRATA_TRACE / strata.torch.trace; docs/
offload.md, "A timeline") as an SVG or PNG, and prints that iteration's figures as JSON.

An iteration is the i-th forward of the outermost module (``--iteration``, from 1) to the
end of the optimizer step that follows it. Rows: the phases (forward, backward, step), the
modules of depth ``--depth`` (forward and backward), the stalls of the training thread,
the parameter reads of the fetch thread, the fetches in flight (issue to read), the
step's gradient reads, batches, C++ pipelines and parameter writes, and the gradient writes
in flight.

    PYTHONPATH=build/python /usr/bin/python3 scripts/trace_chart.py trace.json docs/img/timeline.svg --iteration 2
"""

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from strata.torch import trace_spans as spans  # noqa: E402


def window(sp, i):
    roots = sorted(s[3] for s in sp if s[1] == "forward" and s[5].get("depth") == 0)
    if len(roots) < i:
        sys.exit(f"trace_chart: the trace holds {len(roots)} iterations, not {i}")
    t0 = roots[i - 1]
    steps = sorted(s[4] for s in sp if s[0] == "step" and s[3] >= t0)
    t1 = steps[0] if steps else (roots[i] if len(roots) > i else max(s[4] for s in sp))
    return t0, t1


def summary(sp, t0, t1):
    inside = [s for s in sp if s[3] >= t0 and s[4] <= t1]

    def total(pred):
        return round(sum(s[4] - s[3] for s in inside if pred(s)) / 1e6, 4)

    phase = {n: total(lambda s, n=n: s[1] == "phase" and s[0] == n)
             for n in ("forward", "backward")}
    fetches = [s for s in inside if s[1] == "fetch"]
    pipes = [s for s in inside if s[0] == "pipeline"]
    return {
        "iteration_s": round((t1 - t0) / 1e6, 4),
        "forward_s": phase["forward"], "backward_s": phase["backward"],
        "step_s": total(lambda s: s[0] == "step"),
        "step_batches": sum(1 for s in inside if s[0] == "step.batch"),
        "stall_s": total(lambda s: s[1] == "stall"),
        "stalls": sum(1 for s in inside if s[1] == "stall"),
        "stalls_on_demand": sum(1 for s in inside if s[1] == "stall"
                                and s[5].get("kind") == "miss"),
        "fetches": len(fetches),
        "fetches_prefetched": sum(1 for s in fetches if s[5].get("kind") == "prefetch"),
        "fetch_bytes": sum(s[5].get("nbytes", 0) for s in fetches),
        "fetch_read_s": total(lambda s: s[0].startswith("store.get ")),
        "grad_writes": sum(1 for s in inside if s[0].startswith("grad.write ")),
        "read_grad_s": total(lambda s: s[0] == "read_grad"),
        "write_s": total(lambda s: s[0] == "write"),
        "pipeline_s": round(sum(p[5].get("seconds", 0) for p in pipes), 4),
        "pipeline_compute_s": round(sum(p[5].get("compute_seconds", 0) for p in pipes), 4),
        "pipeline_io_wait_s": round(sum(p[5].get("io_wait_seconds", 0) for p in pipes), 4),
        "pipeline_bytes_read": sum(p[5].get("bytes_read", 0) for p in pipes),
        "pipeline_bytes_written": sum(p[5].get("bytes_written", 0) for p in pipes),
    }


def draw(sp, t0, t1, depth, out, fetch_tid):
    rows = []  # (label, [(start_s, end_s)], color)
    inside = [s for s in sp if s[4] >= t0 and s[3] <= t1]

    def sel(pred):
        return [((s[3] - t0) / 1e6, (s[4] - s[3]) / 1e6) for s in inside if pred(s)]

    rows.append(("forward", sel(lambda s: s[1] == "phase" and s[0] == "forward"), "#4c72b0"))
    rows.append(("backward", sel(lambda s: s[1] == "phase" and s[0] == "backward"),
                 "#dd8452"))
    rows.append(("optimizer step", sel(lambda s: s[0] == "step"), "#55a868"))
    rows.append((f"modules (depth {depth}) fwd",
                 sel(lambda s: s[1] == "forward" and s[5].get("depth") == depth), "#8fb0de"))
    rows.append((f"modules (depth {depth}) bwd",
                 sel(lambda s: s[1] == "backward" and s[5].get("depth") == depth), "#f0b48a"))
    rows.append(("stalls (training thread)", sel(lambda s: s[1] == "stall"), "#c44e52"))
    rows.append(("reads (fetch thread)",
                 sel(lambda s: s[0].startswith("store.get ") and s[2] == fetch_tid), "#8172b3"))
    rows.append(("step: gradient reads", sel(lambda s: s[0] == "read_grad"), "#937860"))
    rows.append(("step: C++ pipeline", sel(lambda s: s[0] == "pipeline"), "#2e8b57"))
    rows.append(("step: parameter writes", sel(lambda s: s[0] == "write"), "#da8bc3"))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True,
                                  gridspec_kw={"height_ratios": [3.2, 1]})
    for k, (label, bars, color) in enumerate(rows):
        y = len(rows) - 1 - k
        shades = [color, color + "99"] if label.startswith("modules") else [color]
        ax.broken_barh(bars, (y - 0.38, 0.76), edgecolor="none",
                       facecolors=[shades[j % len(shades)] for j in range(len(bars))])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.grid(axis="x", alpha=0.3)
    # in flight over time: parameter fetches (issue to read) and gradient writes
    for name, pred, color in (("parameter fetches", lambda s: s[1] == "fetch", "#8172b3"),
                              ("gradient writes", lambda s: s[0].startswith("grad.write "),
                               "#c44e52")):
        edges = []
        for s in inside:
            if pred(s):
                edges += [((max(s[3], t0) - t0) / 1e6, 1), ((min(s[4], t1) - t0) / 1e6, -1)]
        edges.sort()
        xs, ys, n = [0.0], [0], 0
        for x, d in edges:
            xs.append(x)
            ys.append(n)
            n += d
            xs.append(x)
            ys.append(n)
        ax2.plot(xs, ys, color=color, lw=0.9, label=name)
    ax2.set_ylabel("in flight", fontsize=8)
    ax2.legend(fontsize=7, loc="upper right")
    ax2.set_xlabel("seconds since the iteration's forward began")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out", help=".svg or .png")
    ap.add_argument("--iteration", type=int, default=2, help="from 1 (default 2)")
    ap.add_argument("--depth", type=int, default=2, help="module depth drawn (default 2)")
    args = ap.parse_args()
    with open(args.trace) as f:
        ev = json.load(f)["traceEvents"]
    sp = spans(ev, strict=False)
    fetch_tid = next((e["tid"] for e in ev if e["ph"] == "M"
                      and e["args"].get("name") == "strata-param-fetch"), None)
    t0, t1 = window(sp, args.iteration)
    draw(sp, t0, t1, args.depth, args.out, fetch_tid)
    print(json.dumps(summary(sp, t0, t1), indent=1))


if __name__ == "__main__":
    main()
