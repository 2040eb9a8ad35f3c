"""strata's timeline (strata.torch.trace, STRATA_TRACE; docs/offload.md, "A timeline"): a
small offloaded model trained under the trace -- the file parses, holds every kind of
event with sane nesting, and changes no result; nothing is recorded when off; the
environment form; strata's ranges in torch.profiler."""

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import strata.torch as st
from strata.torch import trace_spans
from strata.torch._trace import TRACE

from test_param_offload import Net, model_bytes, train, trainable_groups

EPS = 0.01  # microseconds: ts and dur are rounded to nanoseconds


def _within(s, p):
    return p[3] - EPS <= s[3] and s[4] <= p[4] + EPS


def _setup(tmp, name, seed=0):
    torch.manual_seed(seed)
    model = Net()
    h = st.offload_parameters(model, path=str(tmp / name), working_set=model_bytes(model) // 3)
    opt = st.OffloadAdamW(trainable_groups(model), lr=1e-2, store=h.store, arithmetic="torch",
                          max_grad_norm=1.0)
    return model, h, opt


def _close(h, opt):
    opt.close()
    h.close()


def test_trace_events_and_identical_results(tmp_path):
    ref, h0, opt0 = _setup(tmp_path, "off")
    model, h, opt = _setup(tmp_path, "on")
    path = tmp_path / "trace.json"
    want = train(ref, opt0, 2)
    assert not TRACE.recording and not TRACE.on and TRACE.events == []
    with st.trace(str(path)):
        got = train(model, opt, 2)
    assert got == want
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h0.read(a), h.read(b)), n

    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    assert not TRACE.recording and TRACE.events == []
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "strata-param-fetch" in threads and "training (main thread)" in threads
    spans = trace_spans(ev)
    assert all(end >= start for _, _, _, start, end, _ in spans)
    cats = {c for _, c, *_ in spans} | {e.get("cat") for e in ev if e["ph"] == "i"}
    assert {"forward", "backward", "phase", "fetch", "store", "stall", "optimizer",
            "evict"} <= cats
    names = {n for n, *_ in spans}
    for want_name in ("Net", "Net.fc1", "Net.emb", "forward", "backward", "step",
                      "step.batch", "pipeline", "read_grad", "write"):
        assert want_name in names, want_name
    assert any(n.startswith("grad.write ") for n in names)
    assert any(n.startswith("store.get ") for n in names)

    # module events: 2 iterations, the block's modules called twice per forward
    fwd = [s for s in spans if s[1] == "forward"]
    assert sum(1 for s in fwd if s[0] == "Net") == 2
    assert sum(1 for s in fwd if s[0] == "Net.fc1") == 4
    bwd = [s for s in spans if s[1] == "backward"]
    assert sum(1 for s in bwd if s[0] == "Net") == 2 and sum(1 for s in bwd if s[0] == "Net.fc1") == 4
    roots = sorted((s for s in spans if s[0] == "Net"), key=lambda s: s[3])
    for s in fwd + bwd:  # every module's span lies within its root's span of that kind
        assert any(r[1] == s[1] and _within(s, r) for r in roots), s

    # phases: stalls within a forward or backward phase; fetches complete after issue,
    # read on the fetch thread
    phases = [s for s in spans if s[1] == "phase"]
    stalls = [s for s in spans if s[1] == "stall"]
    assert stalls
    for s in stalls:
        assert any(_within(s, p) for p in phases), s
    fetch_tid = next(e["tid"] for e in ev if e["ph"] == "M"
                     and e["args"]["name"] == "strata-param-fetch")
    fetches = [s for s in spans if s[1] == "fetch"]
    assert fetches and all(s[4] >= s[3] for s in fetches)
    assert any(s[5]["kind"] == "prefetch" for s in fetches)
    for s in fetches:  # each fetch ends when its read ends, a prefetch's on the fetch thread
        tid = fetch_tid if s[5]["kind"] == "prefetch" else s[2]
        assert any(g[0] == "store.get " + s[0][len("fetch "):] and g[2] == tid
                   and abs(g[4] - s[4]) < EPS and g[3] >= s[3] - EPS for g in spans), s
    # the step: batches within the step, the C++ pipeline within a batch
    steps = [s for s in spans if s[0] == "step"]
    assert len(steps) == 2
    for name, parent in (("step.batch", steps), ("pipeline", [s for s in spans
                                                               if s[0] == "step.batch"])):
        for s in (x for x in spans if x[0] == name):
            assert any(_within(s, p) for p in parent), s
    pipe = next(s for s in spans if s[0] == "pipeline")
    assert {"compute_seconds", "io_wait_seconds", "bytes_read"} <= set(pipe[5])
    _close(h0, opt0)
    _close(h, opt)


def test_off_records_nothing(tmp_path):
    model, h, opt = _setup(tmp_path, "s")
    train(model, opt, 2)
    assert not TRACE.recording and not TRACE.on and TRACE.events == []
    assert not list(tmp_path.glob("*.json"))
    _close(h, opt)


def test_one_recording_at_a_time_and_api(tmp_path):
    st.start_trace()
    with pytest.raises(RuntimeError):
        st.start_trace()
    doc = st.stop_trace()
    assert doc["traceEvents"] and not TRACE.recording


def test_environment_variable(tmp_path):
    path = tmp_path / "env-%p.json"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import torch, strata.torch as st
        from test_param_offload import Net, model_bytes, train, trainable_groups
        torch.manual_seed(0)
        m = Net()
        h = st.offload_parameters(m, path={str(tmp_path / "s")!r},
                                  working_set=model_bytes(m) // 3)
        opt = st.OffloadAdamW(trainable_groups(m), lr=1e-2, store=h.store)
        train(m, opt, 2)
        opt.close(); h.close()
        print("pid", __import__("os").getpid())
    """)
    env = dict(os.environ, STRATA_TRACE=str(path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    pid = out.stdout.split("pid")[-1].strip()
    doc = json.loads((tmp_path / f"env-{pid}.json").read_text())
    names = {e["name"] for e in doc["traceEvents"]}
    assert {"Net", "step", "forward", "backward"} <= names


def test_torch_profiler_ranges(tmp_path):
    model, h, opt = _setup(tmp_path, "s")
    train(model, opt, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train(model, opt, 2, start=1)
    keys = {e.key for e in prof.key_averages()}
    for name in ("strata::forward", "strata::backward", "strata::step", "strata::step.batch",
                 "strata::stall"):
        assert name in keys, (name, sorted(k for k in keys if k.startswith("strata")))
    assert not TRACE.recording and TRACE.events == []
    train(model, opt, 3, start=2)  # after the profiler: off again at the next phase
    assert not TRACE.on
    _close(h, opt)
