"""strata's timeline: a Chrome trace-event JSON of training with strata.torch, and strata's
phases as named ranges in ``torch.profiler`` (docs/offload.md, "A timeline").

Switch. ``STRATA_TRACE=/path/trace.json`` (``%p`` in it: the process id) records from the
import of ``strata.torch`` to the process's exit, when the file is written (the whole run:
keep such runs short; a process that recorded no event writes none). :func:`trace` (a context manager) / :func:`start_trace` +
:func:`stop_trace` record a part of a run and write it on exit. One recording at a time
per process. Off (the default), every event site is one attribute check
(``TRACE.on``) or, for once-per-step sites, one call that checks it.

The file is ``{"traceEvents": [...]}`` in the trace-event format (chrome://tracing,
https://ui.perfetto.dev): ``X`` complete events (``ts``/``dur`` in microseconds since the
recording started), ``b``/``e`` async spans, ``i`` instants, ``M`` thread names. Events
(``name`` -- ``cat``; args in brackets):

* ``<module path>`` -- ``forward`` / ``backward``: every module's call (global module hooks,
  installed while recording). A backward span runs from the gradient of the module's
  output to that of its inputs (tensor hooks; no value changes); a module none of whose
  inputs requires grad (an embedding) ends with the backward pass. [depth]
* ``forward`` / ``backward`` -- ``phase``: an offloaded model's forward, and a backward
  through its parameters (to the end of the autograd pass).
* ``fetch <param>`` -- ``fetch``: async, from issue (the training thread) to the data
  read (the fetch thread: ``prefetch``; a miss read on demand: ``demand``); ``store.get
  <param>`` -- ``store``: the read itself, on the thread that did it. [nbytes, kind]
* ``stall <param>`` -- ``stall``: the training thread waited for a parameter (a prefetch
  not yet done: ``hit``, or a miss read on demand). [kind]
* ``evict <param>`` -- ``evict``: instant, a parameter released from the working set.
* ``grad.write <param>`` -- ``store``: async, a gradient's ``put_async`` from issue to when
  it was seen complete (its wait). [nbytes, done_before_wait]
* ``step`` -- ``optimizer``: the optimizer's step; ``step.batch`` -- a batch of the step
  over offloaded parameters; ``pipeline`` -- ``optimizer``: strata's C++ pipeline of that
  batch (masters and moments read, updated, written), with its StepStats (compute_seconds,
  io_wait_seconds, bytes_read, bytes_written); ``read_grad`` / ``write`` -- ``store``:
  a gradient read and an updated parameter stored by the step; ``early_update`` /
  ``finish_step`` -- ``optimizer``: the updates started during backward
  (``overlap_backward=True``) and their completion.

With a ``torch.profiler`` running, the spans (phases, step, batches, stalls, early updates)
are also ``record_function("strata::<name>")`` ranges (checked at each phase's start and at
each step: a profiler started mid-forward shows from the next phase on).

Thread-safety: events are appended from any thread (the GIL orders them).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

_profiling = torch.autograd._profiler_enabled
_record_function = torch.autograd.profiler.record_function


class Recorder:
    """The process's recorder (:data:`TRACE`). ``on``: recording, or a torch profiler was
    running at the last :meth:`refresh`; ``recording``: events are kept."""

    def __init__(self) -> None:
        self.on = False
        self.recording = False
        self.events: List[Dict[str, Any]] = []
        self._origin = 0.0
        self._tids: Dict[int, int] = {}
        self._names: Dict[int, str] = {}  # thread ident -> its name (at its first event)
        self._pid = os.getpid()
        self._fetches: Dict[int, float] = {}  # id(record) -> issue time
        self._writes: Dict[int, tuple] = {}  # id(future) -> (record, issue time, nbytes)
        self._ids = 0
        self._hooks: List[Any] = []
        self._modules: Optional[_ModuleHooks] = None  # (while recording)

    # ---- switching ----------------------------------------------------------------------

    def refresh(self) -> bool:
        """``on`` := recording or a torch profiler running; returns it."""
        self.on = self.recording or bool(_profiling())
        return self.on

    def start(self) -> None:
        if self.recording:
            raise RuntimeError("strata.torch: a trace is already being recorded "
                               "(one at a time per process)")
        self.events, self._tids, self._names = [], {}, {}
        self._fetches, self._writes = {}, {}
        self._pid = os.getpid()
        self._origin = time.perf_counter()
        self.recording = self.on = True
        self._modules = _ModuleHooks(self)
        self._modules.install()

    def stop(self, path: Optional[str]) -> Dict[str, Any]:
        """Stops recording; writes the trace to ``path`` (unless None) and returns it."""
        if self._modules is not None:
            self._modules.remove()
            self._modules = None
        self.recording = False
        self.refresh()
        doc = {"traceEvents": self._metadata() + self.events, "displayTimeUnit": "ms",
               "otherData": {"producer": "strata.torch trace", "pid": self._pid}}
        self.events = []
        if path is not None:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, path)
        return doc

    # ---- low-level events ---------------------------------------------------------------

    def _us(self, t: float) -> float:
        return round((t - self._origin) * 1e6, 3)

    def _tid(self) -> int:
        ident = threading.get_ident()
        tid = self._tids.get(ident)
        if tid is None:
            tid = self._tids[ident] = len(self._tids) + 1
        return tid

    def _metadata(self) -> List[Dict[str, Any]]:
        names = {t.ident: t.name for t in threading.enumerate()}
        names.update(self._names)
        out = [{"ph": "M", "name": "process_name", "pid": self._pid, "tid": 0,
                "args": {"name": "strata.torch"}}]
        for ident, tid in self._tids.items():
            name = names.get(ident, f"thread {ident}")
            if ident == threading.main_thread().ident:
                name = "training (main thread)"
            out.append({"ph": "M", "name": "thread_name", "pid": self._pid, "tid": tid,
                        "args": {"name": name}})
        return out

    def complete(self, name: str, cat: str, t0: float, t1: float,
                 args: Optional[Dict[str, Any]] = None) -> None:
        """An ``X`` event on the calling thread from ``t0`` to ``t1`` (perf_counter s)."""
        if not self.recording:
            return
        ts = self._us(t0)
        ev = {"ph": "X", "name": name, "cat": cat, "ts": ts,
              "dur": max(round(self._us(t1) - ts, 3), 0.0), "pid": self._pid,
              "tid": self._tid()}
        if args:
            ev["args"] = args
        self.events.append(ev)
        self._name_thread()

    def _name_thread(self) -> None:
        names = self._names
        ident = threading.get_ident()
        if ident not in names:
            names[ident] = threading.current_thread().name

    def instant(self, name: str, cat: str, args: Optional[Dict[str, Any]] = None) -> None:
        if not self.recording:
            return
        ev = {"ph": "i", "s": "t", "name": name, "cat": cat, "pid": self._pid,
              "tid": self._tid(), "ts": self._us(time.perf_counter())}
        if args:
            ev["args"] = args
        self.events.append(ev)
        self._name_thread()

    def async_span(self, name: str, cat: str, t0: float, t1: float,
                   args: Optional[Dict[str, Any]] = None) -> None:
        """A ``b``/``e`` pair (its own row in the viewers: spans may overlap)."""
        if not self.recording:
            return
        self._ids += 1
        base = {"name": name, "cat": cat, "id": self._ids, "pid": self._pid, "tid": self._tid()}
        b = dict(base, ph="b", ts=self._us(t0))
        if args:
            b["args"] = args
        self.events.append(b)
        self.events.append(dict(base, ph="e", ts=self._us(max(t1, t0))))
        self._name_thread()

    # ---- spans (also torch.profiler ranges) ---------------------------------------------

    @contextlib.contextmanager
    def _span(self, name: str, cat: str, args: Optional[Dict[str, Any]]):
        rf = _record_function("strata::" + name) if _profiling() else None
        if rf is not None:
            rf.__enter__()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            if rf is not None:
                rf.__exit__(None, None, None)
            self.complete(name, cat, t0, t1, args)

    def span(self, name: str, cat: str, args: Optional[Dict[str, Any]] = None):
        """A context manager: an ``X`` event and a ``strata::<name>`` profiler range."""
        if not (self.recording or _profiling()):
            return contextlib.nullcontext()
        return self._span(name, cat, args)

    def begin(self, name: str) -> Any:
        """Opens a span closed by :meth:`end` (across callbacks); returns its token."""
        rf = _record_function("strata::" + name) if _profiling() else None
        if rf is not None:
            rf.__enter__()
        return (name, time.perf_counter(), rf)

    def end(self, token: Any, cat: str, args: Optional[Dict[str, Any]] = None) -> None:
        name, t0, rf = token
        if rf is not None:
            rf.__exit__(None, None, None)
        self.complete(name, cat, t0, time.perf_counter(), args)

    # ---- strata's event sites ------------------------------------------------------------

    def phase_begin(self, name: str) -> None:
        self._phase = self.begin(name)

    def phase_end(self) -> None:
        token = self.__dict__.pop("_phase", None)
        if token is not None:
            self.end(token, "phase")

    def backward_begin(self) -> None:
        """A backward through offloaded parameters began (inside autograd): ends with it."""
        token = self.begin("backward")
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: self.end(token, "phase"))

    def fetch_issued(self, s: Any) -> None:
        self._fetches[id(s)] = time.perf_counter()

    def fetch_read(self, s: Any, t0: float, t1: float) -> None:
        """The fetch of record ``s`` read its data from ``t0`` to ``t1`` (this thread)."""
        self.complete(f"store.get {s.name}", "store", t0, t1, {"nbytes": s.nbytes})
        issued = self._fetches.pop(id(s), None)
        self.async_span(f"fetch {s.name}", "fetch", t0 if issued is None else issued, t1,
                        {"nbytes": s.nbytes, "kind": "demand" if issued is None else "prefetch"})

    def stall_begin(self, s: Any) -> Any:
        """The training thread is about to wait for record ``s`` (not in memory)."""
        rf = _record_function("strata::stall") if _profiling() else None
        if rf is not None:
            rf.__enter__()
        return rf, "prefetch" if s.state.name == "FETCHING" else "miss"

    def stall_end(self, token: Any, s: Any, t0: float) -> None:
        if token is None:  # (the recording started during the wait)
            return
        rf, kind = token
        if rf is not None:
            rf.__exit__(None, None, None)
        self.complete(f"stall {s.name}", "stall", t0, time.perf_counter(),
                      {"kind": kind, "nbytes": s.nbytes})

    def grad_write_issued(self, s: Any, fut: Any, nbytes: int) -> None:
        if self.recording:
            self._writes[id(fut)] = (s.name, time.perf_counter(), nbytes)

    def grad_write_done(self, fut: Any, was_done: bool) -> None:
        w = self._writes.pop(id(fut), None)
        if w is not None:
            self.async_span(f"grad.write {w[0]}", "store", w[1], time.perf_counter(),
                            {"nbytes": w[2], "done_before_wait": was_done})

    def pipeline(self, st: Dict[str, Any]) -> None:
        """strata's C++ step of a batch just returned: its StepStats as a span."""
        t1 = time.perf_counter()
        args = {k: st[k] for k in ("seconds", "compute_seconds", "io_wait_seconds",
                                    "bytes_read", "bytes_written", "tensors_updated")
                if k in st}
        self.complete("pipeline", "optimizer", t1 - float(st.get("seconds", 0.0)), t1, args)


#: the process's recorder
TRACE = Recorder()


def traced(name: str, cat: str) -> Callable[[Callable], Callable]:
    """Decorates a once-per-step function: a span (and profiler range) ``name`` around it
    while recording or profiling; off, one check and the call."""
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not (TRACE.recording or _profiling()):
                return fn(*args, **kwargs)
            with TRACE._span(name, cat, None):
                return fn(*args, **kwargs)
        return wrapper
    return deco


class _ModuleHooks:
    """Every module's forward and backward as events (global module hooks while
    recording; see the module doc)."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.handles: List[Any] = []
        self.names: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = \
            weakref.WeakKeyDictionary()
        self.starts: Dict[int, List[float]] = {}
        self.bwd_open: List[list] = []  # calls whose backward started and did not end
        self.cb_queued = False

    def install(self) -> None:
        mm = torch.nn.modules.module
        self.handles = [mm.register_module_forward_pre_hook(self.pre),
                        mm.register_module_forward_hook(self.post)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.starts, self.bwd_open = {}, []

    def _name(self, m: torch.nn.Module) -> tuple:
        n = self.names.get(m)
        if n is None:  # the outermost module seen first names its submodules
            root = type(m).__name__
            for path, sub in m.named_modules():
                if sub not in self.names:
                    self.names[sub] = (f"{root}.{path}" if path else root,
                                       path.count(".") + 1 if path else 0)
            n = self.names[m]
        return n

    def pre(self, m: torch.nn.Module, inputs: Any) -> None:
        call = [self._name(m), None, 0]  # (name, depth), backward start, inputs pending
        if torch.is_grad_enabled():
            for x in _tensors(inputs):
                if x.requires_grad:
                    call[2] += 1
                    x.register_hook(functools.partial(self._input_grad, call))
        self.starts.setdefault(id(m), []).append((time.perf_counter(), call))

    def post(self, m: torch.nn.Module, inputs: Any, output: Any) -> None:
        stack = self.starts.get(id(m))
        if not stack:  # (called before the recording started)
            return
        t0, call = stack.pop()
        name, depth = call[0]
        self.rec.complete(name, "forward", t0, time.perf_counter(), {"depth": depth})
        if torch.is_grad_enabled():
            for y in _tensors(output):
                if y.requires_grad:
                    y.register_hook(functools.partial(self._output_grad, call))

    def _output_grad(self, call: list, grad: Any) -> None:
        if call[1] is None:
            call[1] = time.perf_counter()
            self.bwd_open.append(call)
            if not self.cb_queued:
                self.cb_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)

    def _input_grad(self, call: list, grad: Any) -> None:
        call[2] -= 1
        if call[2] == 0 and call[1] is not None:
            self._finish(call, time.perf_counter())

    def _finish(self, call: list, t1: float) -> None:
        (name, depth), t0 = call[0], call[1]
        self.rec.complete(name, "backward", t0, t1, {"depth": depth})
        call[1] = None
        with contextlib.suppress(ValueError):
            self.bwd_open.remove(call)

    def _backward_end(self) -> None:
        self.cb_queued = False
        t1 = time.perf_counter()
        for call in list(self.bwd_open):
            self._finish(call, t1)
        self.bwd_open = []


def _tensors(x: Any) -> List[torch.Tensor]:
    """The tensors of a module's inputs/outputs (one level of tuple/list/dict)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, torch.Tensor)]
    if isinstance(x, dict):
        return [t for t in x.values() if isinstance(t, torch.Tensor)]
    return []


# ---- the public switch -------------------------------------------------------------------

def spans(events: List[Dict[str, Any]], strict: bool = True
          ) -> List[Tuple[str, str, int, float, float, Dict]]:
    """The spans of a trace's ``traceEvents``: each "X" (complete) event and each matched
    "b"/"e" (async begin/end) pair as ``(name, cat, tid, start_us, end_us, args)``
    (microseconds, the trace's clock); instant and metadata events are left out. Used by
    scripts/trace_chart.py and the tests. Pure function.

    :param strict: raise on an unmatched begin or end (else they are left out).
    :raises ValueError: (strict) an "e" event without its "b", or a "b" never ended."""
    out: List[Tuple[str, str, int, float, float, Dict]] = []
    open_: Dict[Tuple[str, Any], Dict[str, Any]] = {}
    for e in events:
        if e["ph"] == "X":
            out.append((e["name"], e["cat"], e["tid"], e["ts"], e["ts"] + e["dur"],
                        e.get("args", {})))
        elif e["ph"] == "b":
            open_[(e["cat"], e["id"])] = e
        elif e["ph"] == "e":
            b = open_.pop((e["cat"], e["id"]), None)
            if b is None:
                if strict:
                    raise ValueError(f"trace: an end event without its begin: {e}")
                continue
            out.append((b["name"], b["cat"], b["tid"], b["ts"], e["ts"], b.get("args", {})))
    if open_ and strict:
        raise ValueError(f"trace: {len(open_)} begin events never ended")
    return out


def start_trace() -> None:
    """Starts recording strata's timeline (see the module doc).

    :raises RuntimeError: a recording is already running in this process."""
    TRACE.start()


def stop_trace(path: Optional[str] = None) -> Dict[str, Any]:
    """Stops recording; writes the trace-event JSON to ``path`` (unless None).

    :returns: the trace (``{"traceEvents": [...], ...}``).
    :raises OSError: ``path`` cannot be written."""
    return TRACE.stop(path)


@contextlib.contextmanager
def trace(path: Optional[str]):
    """Records strata's timeline within the ``with``; writes it to ``path`` on exit (also
    when the body raises); yields the recorder."""
    start_trace()
    try:
        yield TRACE
    finally:
        stop_trace(path)


def _from_environment() -> None:
    path = os.environ.get("STRATA_TRACE")
    if not path:
        return
    path = path.replace("%p", str(os.getpid()))
    start_trace()
    # (a process that recorded nothing -- e.g. a parent that only starts workers -- writes
    # no file)
    atexit.register(lambda: TRACE.recording and stop_trace(path if TRACE.events else None))


_from_environment()
