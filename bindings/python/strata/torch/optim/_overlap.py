"""The optimizer step overlapped with backward (``overlap_backward=True`` of OffloadAdam /
OffloadAdamW).

A hook on each parameter's gradient accumulator (its AccumulateGrad node: torch 1.13 has no
``register_post_accumulate_grad_hook``) fires once the parameter's gradient is final for
the backward; the parameter joins a bucket, and each full bucket's update starts at once on
strata's side (C++ ``OffloadedOptimizer::start_update``: state read from NVMe, updated on
the CPU threads and written back while backward goes on). The updated weights go to a
staging copy, not to the parameter, since backward may still read it; ``step()`` waits for
what is in flight, checks the speculation, and copies the staged weights into the
parameters.

Exactness. The early updates speculate that the step is not skipped (no inf/NaN gradient)
and not clipped (global norm within ``max_grad_norm``); ``step()`` computes the same gate as
the ordinary step and, when it fails, the store rolls the early updates back (savepoints of
the copy-on-write chunks) and the step is redone after backward. It is also redone when
anything the early updates used changed before ``step()``: a gradient whose bytes were
edited or that was replaced after backward (e.g. a hand-written clipping that clips, or
unscaling), a parameter changed, a
``closure`` passed to step(), or hyperparameters set in between (strata compares them). So
results are bit-identical to ``overlap_backward=False``; a redo costs the early I/O again.

Speculation policy: a step that was clipped or skipped makes the next backward start no
early updates (a clipped run usually stays clipped for a while, and each failed speculation
costs its I/O twice); speculation resumes after a step that was neither (nor redone).
Hand-written clipping (``torch.nn.utils.clip_grad_norm_``, which rescales every gradient in
place) keeps the speculation when it does not clip (a factor of 1.0 changes no byte: the
fingerprints match) and makes a redo when it does, as ``max_grad_norm=`` does.

Gradient accumulation: wrap the backward passes that must not step in
``with opt.accumulating(): loss.backward()`` (like DDP's ``no_sync``). Without it, each
backward restarts the speculation (the earlier one is rolled back), still exact but with
wasted I/O.

Offloaded parameters (strata.torch.offload_parameters, fp32, one process): the update
runs inside backward too, and the parameter's store object IS the optimizer's fp32 master
(linked: ParameterOffload.link_master), so one iteration moves per parameter: forward's and
backward's fetches (4 + 4 bytes read), the moments (8 read, 8 written) and the master (4
written; not read: the early update copies the parameter materialized for backward). The
gradient never goes to the store: the offload hands each final gradient to :meth:`take`
(offload/_record.py, OptimizerLink), strata updates from it while backward goes on, and
the buffer is released once its update ran (at most half the working set of them waits).
Reading or writing a started parameter's value before step() (an eval forward, an edit,
a checkpoint) rolls the early updates back first. The gate is then Python's (the norms the
offload took in backward, in the model's order, as optim/_offloaded_step.py): step()
commits the early updates when the step is neither skipped nor clipped and nothing they
used changed; otherwise it rolls them back and steps as without overlap, from the
gradients -- which are stored only when ``max_grad_norm`` is set (4 bytes more written per
parameter; without it, a redo that needs them raises RuntimeError naming the parameter,
after the rollback: nothing changed).

Thread-safety: the hooks run on torch's autograd thread (the caller's, for CPU models);
one backward at a time per optimizer.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .._common import host_grad, watch_accumulation
from .._trace import traced
from ..offload import is_offloaded, offload_of
from ._exchange import TensorExchange
from ._param_table import ParamTable, offloads


#: why step() or the optimizer rolled early updates back (BackwardOverlap.abort's reasons)
CLOSURE = "a closure was passed to step()"
CHANGED = "a gradient or parameter the early updates used changed after backward"
EDITED = "parameters, param_groups or optimizer.state were changed after backward"
STATE_USED = ("optimizer.state, state_dict(), load_state_dict(), checkpoint(), "
              "add_param_group() or close() was used between backward and step()")


class BackwardOverlap:
    """The overlap machinery of one optimizer (see the module doc).

    :param table: the optimizer's ParamTable (``core``: the strata.OffloadedOptimizer whose
        begin_step / start_update / finish_step / abort_step run the early updates; None
        once the optimizer closed).
    :param exchange: the optimizer's TensorExchange (told which gradients were attached
        behind its back).
    :param bytes_moved: the optimizer's byte counters, updated in place.
    :param prepare: called (on the autograd thread) before the first early update of a
        backward: takes what step() would take first (param_groups and parameter edits,
        optimizer.state edits, hyperparameters) and returns the ``max_grad_norm`` of the
        step, or None when that failed (step() then raises it, as torch would, not
        backward). A weak callable (it must not keep the optimizer alive).
    :param bucket_numel: elements gathered before they are handed to strata (>= 1; 1 =
        each gradient at once). strata merges whatever arrived while its previous batch ran,
        so small values let the last gradients of backward start at once. Default 1.
    """

    def __init__(self, table: ParamTable, exchange: TensorExchange,
                 bytes_moved: Dict[str, int], prepare: Callable[[], Optional[float]],
                 bucket_numel: int = 1, store: Any = None):
        self._table = table
        self._exchange = exchange
        self._bytes_moved = bytes_moved
        self._prepare = prepare
        self.bucket_numel = max(1, int(bucket_numel))
        self._accumulators: Dict[int, Any] = {}  # id(param) -> its AccumulateGrad node
        self._suspended = 0
        self._open = False
        #: id(param) -> (param, its grad tensor, the grad's (_version, data_ptr), the param's
        #: (_version, data_ptr), staged weights, the grad's host copy given to strata or None)
        self._started: Dict[int, Tuple[torch.nn.Parameter, torch.Tensor, Any, Any,
                                       torch.Tensor, Optional[torch.Tensor]]] = {}
        self._bucket: List[Tuple[int, torch.Tensor, torch.Tensor]] = []
        self._bucket_numel = 0
        self._staged: Dict[int, torch.Tensor] = {}  # id(param) -> staging buffer, reused
        self._callback_queued = False
        self.backward_end: Optional[float] = None  # time.perf_counter() at its end
        self._speculate = True  # the last step was neither clipped nor skipped
        #: the optimizer's store: offloaded parameters in it are linked (their value is the
        #: master), those of another store are stepped after backward
        self._store = store
        #: the open step's gate is Python's (the table holds offloaded parameters): strata's
        #: begin_step speculates scale 1 with no clipping of its own
        self.python_gate = False
        self.broken = False  # a taken gradient was edited since: step() redoes
        self.keeps_grads = False  # taken gradients are also stored (max_grad_norm set)
        #: why the last early updates of offloaded parameters were rolled back ("": none)
        self.abort_reason = ""
        #: id(param) -> (param, the buffer staged for its new value or None): offloaded
        #: parameters whose update started in this backward
        self._started_off: Dict[int, Tuple[torch.nn.Parameter, Optional[torch.Tensor]]] = {}
        #: buffers of transient entries (gradient, master view) until wait_started()
        self._transient: List[Any] = []
        self._transient_bytes = 0
        self._master_keys: Dict[int, str] = {}  # id(param) -> its master's store key

    # ---- hooks -----------------------------------------------------------------------------

    def watch(self, p: torch.nn.Parameter) -> None:
        """Hooks parameter ``p``'s gradient accumulator (no-op when it needs no gradient or
        is hooked already)."""
        if id(p) in self._accumulators or not p.requires_grad or is_offloaded(p):
            return  # (an offloaded parameter's gradient comes through take())
        self._accumulators[id(p)] = watch_accumulation(p, lambda p=p: self._on_grad(p))

    @contextlib.contextmanager
    def suspended(self):
        """Backward passes inside do not start updates (gradient accumulation)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        table = self._table
        if (self._suspended or not self._speculate or table.core is None
                or id(p) not in table.handle or is_offloaded(p) or p.grad is None):
            return  # (an offloaded parameter's gradient comes through take())
        if id(p) in self._started or any(e[0] == id(p) for e in self._bucket):
            self.abort()  # a second backward before step(): start again (accumulation)
        if not self._begin():
            return
        g = host_grad(p.grad)
        staged = self._staged.get(id(p))
        if staged is None or staged.dtype != p.dtype or staged.numel() != p.numel():
            staged = torch.empty(p.numel(), dtype=p.dtype, pin_memory=p.is_cuda)
            self._staged[id(p)] = staged
        # A gradient strata reads through a copy (non-contiguous, converted, CUDA): strata's
        # fingerprint covers the copy, so step() compares the copy with the gradient again.
        copied = g if g.data_ptr() != p.grad.data_ptr() or g.is_cuda != p.grad.is_cuda else None
        self._started[id(p)] = (p, p.grad, (p.grad._version, p.grad.data_ptr()),
                                (p._version, p.data_ptr()), staged, copied)
        self._bucket.append((id(p), g, staged))
        self._bucket_numel += p.numel()
        if self._bucket_numel >= self.bucket_numel:
            self._flush_bucket()

    def _begin(self) -> bool:
        """Opens the overlapped step of this backward (no-op when open); False when step()'s
        preparation failed (step() raises it)."""
        if not self._open:
            table = self._table
            # What step() takes first, taken before the early updates use it: edits of
            # param_groups and parameters since the last step, optimizer.state edits, and
            # the hyperparameters (e.g. a scheduler's step after the last opt.step()).
            max_grad_norm = self._prepare()
            if max_grad_norm is None:
                return False
            self.python_gate = bool(offloads(table.params))
            if self.python_gate:
                self.link_offloaded()
            self.keeps_grads = max_grad_norm > 0
            self.broken = False
            self.abort_reason = ""
            table.core.begin_step(max_grad_norm=0.0 if self.python_gate else max_grad_norm)
            self._open = True
            self.backward_end = None
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._callback_queued = True
        return True

    # ---- offloaded parameters (offload/_record.py, OptimizerLink) ------------------------------

    def link_offloaded(self) -> None:
        """Links every fp32 offloaded parameter of one process in the optimizer's store whose
        master holds its current value (the step synced it: unchanged since)."""
        table = self._table
        for p in table.params:
            o = offload_of(p)
            if (o is None or o.linked(p) or p.dtype != torch.float32 or o.comm is not None
                    or o.tiled(p)
                    or o.store is not self._store or id(p) not in table.handle
                    or p.numel() == 0 or table.changed(table.handle[id(p)])):
                continue
            info = table.core.param_info(table.handle[id(p)])
            if info["placement"] != "nvme":  # a host-tier master is no store object
                continue
            self._master_keys[id(p)] = info["master_key"]
            o.link_master(p, self)

    def unlink_all(self) -> None:
        """The optimizer closes: every linked parameter's value goes back to its own object."""
        self.abort()
        for p in self._table.params:
            o = offload_of(p)
            if o is not None and not o.closed and o.linked(p):
                o.unlink_master(p)

    def master_key(self, p: torch.nn.Parameter) -> str:
        return self._master_keys[id(p)]

    def before_access(self, p: torch.nn.Parameter) -> None:
        if self._open and id(p) in self._started_off:
            self.abort(f"offloaded parameter {offload_of(p).name_of(p)!r} was read or written between backward "
                       "and step() (a forward, state_dict(), a copy, an edit)")

    def started(self, p: torch.nn.Parameter) -> bool:
        return self._open and id(p) in self._started_off

    def write_master(self, p: torch.nn.Parameter, flat: torch.Tensor) -> None:
        self._table.core.write_param(self._table.handle[id(p)], flat.numpy())

    def edited(self, p: torch.nn.Parameter) -> None:
        if id(p) in self._started_off:
            self.broken = True

    def take(self, p: torch.nn.Parameter, grad: torch.Tensor) -> bool:
        """Offloaded ``p``'s final gradient of this backward (1-d, CPU, fp32): its update
        starts now, from the materialized value when it is in memory. False when it is not
        taken (accumulating(), no speculation, ``p`` outside the optimizer; the offload
        does not offer a non-finite gradient: that step is skipped)."""
        table = self._table
        if (self._suspended or not self._speculate or table.core is None
                or id(p) not in table.handle or grad.dtype != torch.float32):
            return False
        if id(p) in self._started_off:
            # a second backward before step(): stepped after it instead
            self.abort("a second backward ran before step() (wrap the earlier ones in "
                       "optimizer.accumulating())")
            return False
        if not self._begin():
            return False
        o = offload_of(p)
        master = o.master_view(p)
        grad = grad.contiguous()
        # the new value into a staged buffer when p stays materialized: no fetch after
        staged = o.stage(p) if master is not None else None
        try:
            table.core.start_update([(table.handle[id(p)], grad, staged, master, True)])
        except BaseException:
            if staged is not None:
                o.unstage(p, staged)
            raise
        self._started_off[id(p)] = (p, staged)
        self._transient.append((grad, master))
        self._transient_bytes += grad.numel() * 4
        if self._transient_bytes > o.working_set_bytes // 2:
            table.core.wait_started()  # their updates ran: the buffers may go
            self._transient, self._transient_bytes = [], 0
        return True

    def started_offloaded(self) -> List[Tuple[torch.nn.Parameter, Optional[torch.Tensor]]]:
        """(parameter, staged buffer of its new value or None) of the offloaded parameters
        whose update started in this backward."""
        return list(self._started_off.values())

    def _on_backward_end(self) -> None:
        self._callback_queued = False
        if self._open:
            self._flush_bucket()
        self.backward_end = time.perf_counter()

    @traced("early_update", "optimizer")
    def _flush_bucket(self) -> None:
        if not self._bucket:
            return
        table = self._table
        entries = [(table.handle[pid], g, staged) for pid, g, staged in self._bucket]
        self._bucket, self._bucket_numel = [], 0
        table.core.start_update(entries)
        self._bytes_moved["host_grads_read"] += sum(g.numel() * g.element_size()
                                                    for _, g, _ in entries)

    # ---- the step ----------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        """An overlapped step is in flight (a backward started updates since the last
        step)."""
        return self._open

    def is_started(self, p: torch.nn.Parameter) -> bool:
        return id(p) in self._started

    def still_valid(self) -> bool:
        """True when every started parameter still has the gradient strata was given (same
        tensor and memory, no in-place op on it) and is itself unmodified. In-place edits
        through ``.data`` (which bump no version counter) are caught by strata's fingerprints
        of the gradients (finish_step)."""
        for p, g, g_mark, p_mark, _, copied in self._started.values():
            # A gradient changed in place (its _version moved) may hold the same bytes
            # (clip_grad_norm_ rescaling by exactly 1.0): strata's fingerprints decide.
            if (p.grad is not g or g.data_ptr() != g_mark[1]
                    or (p._version, p.data_ptr()) != p_mark):
                return False
            if copied is not None and not torch.equal(host_grad(g), copied):
                return False
        return True

    def after_step(self, stats: Dict[str, Any]) -> None:
        """Records whether the next backward speculates (see the module doc)."""
        self._speculate = (not stats["skipped"] and not stats["clip_coef"] < 1.0
                           and not stats.get("rolled_back", False))
        self.link_offloaded()  # (parameters offloaded or registered since)

    def abort(self, reason: str = "") -> None:
        """Rolls back the early updates (nothing changes); no-op when none is open.
        ``reason`` (what made it necessary) is kept for the step's error messages
        (``abort_reason``) when offloaded parameters had started."""
        if not self._open:
            return
        if self._started_off and reason:
            self.abort_reason = reason
        self._bucket, self._bucket_numel = [], 0
        for pid in self._started:
            self._exchange.forget_grad(self._table.handle[pid])
        self._started.clear()
        started_off, self._started_off = self._started_off, {}
        self._open = False
        try:
            self._table.core.abort_step()
        finally:
            self._transient, self._transient_bytes = [], 0
            for p, staged in started_off.values():
                if staged is not None:
                    offload_of(p).unstage(p, staged)

    @traced("finish_step", "optimizer")
    def finish(self, max_grad_norm: float, grad_summary: Any = None) -> Dict[str, Any]:
        """Completes the open step (strata's finish_step: its gate decides on skipping and
        clipping, from ``grad_summary`` when given -- see optim/_gate.py) after the caller
        attached the gradients of the parameters not started; copies the staged weights
        into the started parameters. Returns strata's step statistics plus
        ``exposed_seconds`` (end of backward to now) and ``overlapped_seconds`` (the early
        updates' time)."""
        table = self._table
        self._flush_bucket()
        started, self._started = self._started, {}
        self._started_off = {}
        self._open = False
        for pid in started:
            self._exchange.forget_grad(table.handle[pid])
        try:
            stats = table.core.finish_step(max_grad_norm=max_grad_norm,
                                           grad_summary=grad_summary)
        finally:
            self._transient, self._transient_bytes = [], 0
        if not stats["skipped"]:
            with torch.no_grad():
                for p, _, _, _, staged, _ in started.values():
                    # staged is in p's logical element order: any layout (channels_last)
                    p.copy_(staged.view(p.shape), non_blocking=p.is_cuda)
                    table.mark(table.handle[id(p)])  # the master and p agree
                    nbytes = p.numel() * p.element_size()
                    self._bytes_moved["host_to_device" if p.is_cuda else
                                      "host_weights_written"] += nbytes
        end = time.perf_counter()
        stats["exposed_seconds"] = end - (self.backward_end or end)
        stats["overlapped_seconds"] = stats["early_seconds"]
        return stats
