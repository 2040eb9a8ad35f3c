"""The gradient store of parameter offload (strata.torch.offload_parameters): gradients of
offloaded parameters moved to the store as torch produces them, reduce-scattered to their
owners over ranks, read back by the optimizer's step; torch's accumulation and zero_grad
semantics, and what ``p.grad`` is between backward and step (an OffloadedGrad,
offload/_grad_tensor.py: reads, in-place edits, ``p.grad = None`` / ``= t``).

Thread-safety: as ParameterOffload (the training thread; hooks run on torch's autograd
thread, the caller's for CPU models).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from .._common import all_finite, host_grad, no_torch_function as _no_tf, watch_accumulation
from .._trace import TRACE
from ._grad_host import HostGrads
from ._grad_sum import note_sum, read_sum, sum_base, wants_fp32
from ._grad_tensor import OffloadedGrad, make_grad
from ._record import ParamRecord, tensor_of


class GradInfo(NamedTuple):
    """What the gradient store knows of one parameter's gradient since the last zero_grad
    (:meth:`ParameterOffload.grad_info`)."""

    #: a gradient was accumulated (or zeroed by ``zero_grad(set_to_none=False)``)
    has_grad: bool
    #: every element is finite (True without a gradient)
    finite: bool
    #: ``torch.norm(grad, 2.0)`` (0-d, the gradient's dtype; this rank's slice when
    #: partitioned) when known without reading the gradient, else None (it was edited).
    #: The gradient here is the step's: the fp32 sum of an fp16/bf16 parameter's
    #: micro-batch gradients while ``p.grad`` is unedited (offload/_grad_sum.py), else what
    #: ``p.grad`` shows
    norm: Optional[torch.Tensor]


class GradientStore:
    """The gradients of one ParameterOffload's parameters that a strata optimizer holds.

    Per parameter (its ParamRecord): ``has_grad`` (a gradient since the last zero_grad /
    ``p.grad = None``), ``grad_zero`` (it is all zeros: nothing stored), ``grad_norm`` /
    ``grad_finite`` (known without a read, or None when an edit made them unknown),
    ``grad_ops`` (scalings recorded, replayed at the next read), ``grad_mem`` (the
    materialized gradient, shaped, on the parameter's device, or None), ``grad_mark`` (its
    ``_version`` when norm/finite were last taken from it), ``grad_dirty`` (it differs from
    the stored one), ``grad_obj`` (the OffloadedGrad that ``p.grad`` returns); with fp32
    accumulation (offload/_grad_sum.py) ``grad_acc32``, ``grad_obj32``, ``grad_sum``,
    ``sum_norm``, ``sum_finite``. ``host`` (HostGrads, offload/_grad_host.py) holds the
    gradients that stay in host memory instead of the store, within ``host_budget``.

    :param store: the strata.Store holding them (``<key>#grad`` objects).
    :param records: the offload's ParamRecords (the list itself, which the offload edits).
    :param tier: the store tier of the gradient objects.
    :param inflight_budget: bytes of gradient writes in flight at most, and of materialized
        gradients in memory at most (half the working set each).
    :param comm: a Communicator (ZeRO-3: gradients are reduce-scattered) or None.
    :param average_gradients: with ``comm``, divide the reduced sums by the rank count.
    :param stats: the offload's counters (``grad_bytes_written``/``grad_bytes_read``).
    :param on_backward: called first in each gradient hook (the offload's backward phase).
    :param host_budget: bytes of gradients held in host memory instead of the store
        (offload_parameters' ``grad_host_budget``; 0: none).
    """

    def __init__(self, store: Any, records: List[ParamRecord], tier: str, inflight_budget: int,
                 comm: Any, average_gradients: bool, stats: Dict[str, float],
                 on_backward: Callable[[], None], host_budget: int = 0):
        self.store, self.tier, self.comm = store, tier, comm
        self.records = records  # the offload's list (records are appended there)
        self.inflight_budget = inflight_budget
        self.average_gradients = average_gradients
        self.stats = stats  # the offload's counters, updated in place
        self._on_backward = on_backward
        self._writes: Dict[int, Tuple[Any, torch.Tensor]] = {}  # record index -> (future, grad)
        self._inflight = 0
        self._accumulators: Dict[int, Any] = {}  # id(record) -> its AccumulateGrad node
        self._materialized: Dict[int, ParamRecord] = {}  # id(record) -> record, oldest first
        self._materialized_bytes = 0
        self.host = HostGrads(host_budget)  # gradients held in memory (offload/_grad_host.py)

    def bind(self, s: ParamRecord, fp32_sums: bool = False) -> None:
        """A strata optimizer holds ``s``'s parameter: its gradients go to the store from
        now on (a gradient already in ``p.grad`` is moved at the next collect()), each with
        its norm (the finiteness test computes it anyway); ``fp32_sums``: an fp16/bf16
        parameter's are summed in fp32 from the next backward on (offload/_grad_sum.py).
        Idempotent."""
        s.to_store = True
        s.grad_acc32 = wants_fp32(s, fp32_sums)
        p = s.param
        if p.requires_grad and id(s) not in self._accumulators:
            self._accumulators[id(s)] = watch_accumulation(p, lambda s=s: self._grad_ready(s))

    def unbind_all(self) -> None:
        """The offload closes: every gradient stays in ``p.grad`` from now on, as torch
        leaves it (the hooks on the accumulators become no-ops; stored gradients are
        dropped)."""
        for s in self.records:
            self._drop(s)
            s.to_store = False
        self._accumulators.clear()

    # ---- backward ------------------------------------------------------------------------

    def _grad_ready(self, s: ParamRecord, in_backward: bool = True) -> None:
        """``s.param.grad`` was accumulated by torch: moved to the store (added to the
        stored one when this step already has one, as torch's ``p.grad += g``), or, in
        backward, handed to a linked optimizer's update in backward (OptimizerLink.take)."""
        if not s.to_store:
            return
        self._on_backward()
        p = s.param
        with _no_tf():
            g = p.grad
            if g is None:
                return
            p.grad = None
            g = host_grad(g.detach(), where=f"offloaded parameter {s.name!r}: ",
                          keep_dtype=True)
            given = g  # (outside backward maybe the user's ``p.grad = t``: not held as is)
            acc32 = s.grad_acc32 and g.dtype == s.dtype
            if acc32:  # summed in fp32 (offload/_grad_sum.py): a new fp32 tensor
                g = g.float()
            if self.comm is not None:  # ZeRO-3: every rank gets the sum of its slice
                g = self._reduce_scatter(s, g)
            if s.has_grad and s.grad_zero and not s.grad_ops and s.grad_mem is None:
                # torch: zeroed grad += g (-0.0 becomes +0.0); in backward the gradient is
                # autograd's own new tensor (AccumulateGrad clones one referenced
                # elsewhere), so in place: no second buffer of it
                g = g.add_(0.0) if in_backward or acc32 else g.add(0.0)
            elif s.has_grad:
                old = self._take_host(s, acc32)
                if old is None:
                    old = sum_base(self, s) if acc32 else self.read(s)
                old.add_(g)
                g = old
            self._forget_values(s)
            s.has_grad = True
            if acc32:
                note_sum(s, g)
            else:
                s.grad_norm = torch.norm(g, 2.0)
                s.grad_finite = all_finite(g, s.grad_norm)
        owned = in_backward or g is not given
        if (in_backward and s.link is not None and not acc32 and s.grad_finite
                and s.link.take(p, g.reshape(-1))):
            # the update in backward took it: stored only for a redo
            s.grad_early = "kept" if s.link.keeps_grads else "dropped"
            if s.grad_early == "dropped":
                s.grad_zero = False
                return
            owned = False  # (the update reads it meanwhile: a held sum is a copy)
        self._write(s, g, owned)

    def _take_host(self, s: ParamRecord, acc32: bool) -> Optional[torch.Tensor]:
        """``s``'s gradient held in host memory (offload/_grad_host.py), released, for the
        next backward's gradient to be added to in place, when it is exactly what
        :func:`sum_base` / :meth:`read` would give (no recorded scaling, no materialized
        copy); else None."""
        self._sync_mem(s)
        if s.grad_mem is not None or s.grad_ops or s.grad_zero:
            return None
        if acc32:
            return self.host.take(s, torch.float32) if s.grad_sum else None
        return self.host.take(s, s.dtype)

    def _reduce_scatter(self, s: ParamRecord, g: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of the elements of ``g`` this rank owns (divided by the
        number of ranks with average_gradients, as DDP averages), 1-d, ``g``'s dtype."""
        out = torch.empty(s.state_numel, dtype=g.dtype)
        self.comm.reduce_scatter_grads(g, out)
        if self.average_gradients:
            out.div_(self.comm.size)
        return out

    def _write(self, s: ParamRecord, g: torch.Tensor, owned: bool = True) -> None:
        """Stores ``g`` (flat, CPU) as ``s``'s gradient: held in memory when it fits in the
        host budget (offload/_grad_host.py; ``owned``: ``g`` is referenced nowhere else,
        else a copy is held), else written asynchronously (waited for at flush(), a read,
        or when the writes in flight exceed their budget)."""
        if s.index in self._writes:
            self._wait(s.index)  # one write per object in flight: they complete in order
        s.grad_obj32 = g.dtype != s.dtype  # (an fp32 sum of an fp16/bf16 parameter)
        if self.host.hold(s, g, owned):
            s.grad_zero = False
            return
        nbytes = g.numel() * g.element_size()
        while self._writes and self._inflight + nbytes > self.inflight_budget:
            self._wait(next(iter(self._writes)))
        s.grad_zero = False
        if g.numel() == 0:  # a rank owning no element of a small parameter
            return
        fut = self.store.put_async(s.grad_key, g, tier=self.tier, overwrite=True)
        if TRACE.on: TRACE.grad_write_issued(s, fut, nbytes)  # noqa: E701
        self._writes[s.index] = (fut, g)
        self._inflight += nbytes
        self.stats["grad_bytes_written"] += nbytes

    def _wait(self, index: int) -> None:
        fut, g = self._writes.pop(index)
        self._inflight -= g.numel() * g.element_size()
        done = TRACE.on and fut.done()
        fut.result()
        if TRACE.on: TRACE.grad_write_done(fut, done)  # noqa: E701

    def collect(self) -> None:
        """Gradients still in ``p.grad`` of parameters whose gradients go to the store (a
        parameter bound after its backward, one that did not require grad when the
        optimizer took it, or ``p.grad = t`` assigned by the user) moved to the store as the
        hook would have; then flush()."""
        for s in self.records:
            if s.to_store:
                with _no_tf():
                    has = s.param.grad is not None
                if has:
                    self._grad_ready(s, in_backward=False)
        self.flush()

    def flush(self) -> None:
        """Waits for every gradient write in flight (errors are raised here)."""
        while self._writes:
            self._wait(next(iter(self._writes)))

    # ---- reads (the step, accumulation) ----------------------------------------------------

    @staticmethod
    def _check_kept(s: ParamRecord) -> None:
        """RuntimeError when ``s``'s gradient went to an update in backward unstored."""
        if s.grad_early == "dropped":
            raise RuntimeError(
                f"offloaded parameter {s.name!r}: its gradient was taken by the update in "
                "backward (overlap_backward=True) and not stored, so its values cannot be "
                "read, scaled or accumulated (its norm can: clip_grad_norm_ that does not "
                "clip works); pass max_grad_norm= to the optimizer (gradients are then also "
                "stored for a redo, 4 bytes per parameter), wrap all but the last backward "
                "of an accumulation in optimizer.accumulating(), or use "
                "overlap_backward=False")

    def _read_stored(self, s: ParamRecord) -> torch.Tensor:
        """The stored gradient with the recorded scalings applied: a new flat CPU tensor of
        ``s.state_numel`` elements of the parameter's dtype (an fp32 sum rounded to it
        first, nearest even)."""
        self._check_kept(s)
        held = self.host.get(s)
        if s.grad_zero:
            g = torch.zeros(s.state_numel, dtype=s.dtype)
        elif s.state_numel == 0:
            g = torch.zeros(0, dtype=s.dtype)
        elif held is not None:  # held in memory: copied, no store bytes
            g = held.clone() if held.dtype == s.dtype else held.to(s.dtype)
        else:
            if s.index in self._writes:
                self._wait(s.index)
            g = tensor_of(self.store.get(s.grad_key),
                          torch.float32 if s.grad_obj32 else s.dtype)
            self.stats["grad_bytes_read"] += g.numel() * g.element_size()
            if g.dtype != s.dtype:
                g = g.to(s.dtype)  # what p.grad shows of the fp32 sum
        for op, c in s.grad_ops:
            getattr(g, op)(c)  # the very torch operation recorded, in the gradient's dtype
        return g

    def read(self, s: ParamRecord) -> torch.Tensor:
        """``s``'s accumulated gradient as the step takes it: a flat CPU tensor of
        ``s.state_numel`` elements of the parameter's dtype (zeros after
        ``zero_grad(set_to_none=False)``), with every edit made through ``p.grad``; the
        caller may change it (a new tensor, or the materialized one, which the step
        consumes)."""
        if s.grad_mem is not None:
            with _no_tf():
                return s.grad_mem.detach().reshape(-1).cpu().contiguous()
        return self._read_stored(s)

    def read_for_step(self, s: ParamRecord) -> torch.Tensor:
        """``s``'s gradient as the step takes it: the fp32 sum (a new flat fp32 CPU tensor)
        while it is unedited (offload/_grad_sum.py), else :meth:`read`'s."""
        self._sync_mem(s)
        if s.grad_sum:
            self._check_kept(s)
            held = self.host.get(s)  # (the fp32 sum held in memory: a copy)
            return held.clone() if held is not None else read_sum(self, s)
        return self.read(s)

    def info(self, s: ParamRecord) -> "GradInfo":
        """``s``'s gradient bookkeeping: no I/O unless an edit through ``p.grad`` made its
        finiteness unknown (then it is read)."""
        if not s.has_grad:
            return GradInfo(False, True, None)
        self._sync_mem(s)
        if s.grad_sum:  # the fp32 sum (offload/_grad_sum.py)
            norm = s.sum_norm.clone() if s.device.type == "cpu" else None
            return GradInfo(True, s.sum_finite, norm)
        if s.grad_finite is None:
            g = self._read_stored(s)
            s.grad_finite = all_finite(g)
        return GradInfo(True, s.grad_finite, self.known_norm(s))

    # ---- p.grad (offload/_grad_tensor.py) ----------------------------------------------------

    def get(self, s: ParamRecord) -> Optional[torch.Tensor]:
        """What ``p.grad`` is: the tensor in the parameter's own gradient field when there is
        one (during backward, or one assigned by ``p.grad = t``), else the OffloadedGrad of
        the stored gradient, else None."""
        with _no_tf():
            own = s.param.grad
        if own is not None or not s.has_grad:
            return own
        if s.grad_obj is None:
            s.grad_obj = make_grad(s)
        return s.grad_obj

    def assign(self, s: ParamRecord, value: Optional[torch.Tensor]) -> None:
        """``p.grad = value``: None drops the gradient (the step skips the parameter, as
        torch.optim does); a tensor becomes the gradient (checked by torch as for any
        parameter, kept in the parameter's gradient field until the step or the next
        backward, so it stays aliased as in torch); an OffloadedGrad (``p.grad = p.grad``,
        or another parameter's) is taken by value."""
        if type(value) is OffloadedGrad:
            if value._grad_record is s:
                return
            value = value._grad_record.owner.grads.materialize(value._grad_record).clone()
        with _no_tf():
            s.param.grad = value  # torch's checks (shape, dtype, device) and assignment
        self._drop(s)

    def assign_value(self, s: ParamRecord, value: torch.Tensor) -> None:
        """``p.grad.data = value``: the gradient's values become ``value`` (aliased)."""
        with _no_tf():
            if tuple(value.shape) != s.shape or value.dtype != s.dtype or \
                    value.device != s.device:
                raise RuntimeError(f"offloaded parameter {s.name!r}: p.grad.data = t needs t "
                                   f"of shape {list(s.shape)}, dtype {s.dtype} and device "
                                   f"{s.device} (got {list(value.shape)}, {value.dtype}, "
                                   f"{value.device})")
        self._forget_values(s)
        s.grad_sum = False
        self._hold(s, value)
        s.grad_dirty = True
        s.grad_mark = -1  # norm and finiteness taken from it at the next info()

    def zero_one(self, s: ParamRecord) -> None:
        """``p.grad.zero_()``: the gradient is zeros (nothing read or written)."""
        self._forget_values(s)
        s.grad_sum = False
        s.grad_zero = True
        s.grad_norm = torch.zeros((), dtype=s.dtype)
        s.grad_finite = True

    def scale(self, s: ParamRecord, op: str, c: Any) -> bool:
        """``p.grad.mul_(c)`` / ``div_(c)`` with a scalar ``c``: recorded (replayed at the
        next read; a materialized gradient is scaled at once). Returns False when it must run
        on the values instead (a gradient that is materialized)."""
        if s.grad_mem is not None:
            return False
        cf = float(c)
        s.grad_sum = False  # edited (even by 1, as in memory): the step takes p.grad
        if (op == "mul_" and cf == 1.0) or (op == "div_" and cf == 1.0):
            if not torch.is_tensor(c) or c.dtype.is_floating_point:
                return True  # x * 1.0 == x for every x (NaN and -0.0 included): no change
        if s.grad_zero and 0.0 < cf < float("inf"):
            return True  # zeros stay (positive) zeros
        self._check_kept(s)
        self._edited(s)
        s.grad_ops.append((op, c.detach().clone() if torch.is_tensor(c) else c))
        s.grad_norm = None
        if not (cf == cf and (abs(cf) <= 1.0 if op == "mul_" else abs(cf) >= 1.0)):
            s.grad_finite = None  # a factor that may overflow: tested at the next read
        return True

    def known_norm(self, s: ParamRecord) -> Optional[torch.Tensor]:
        """``torch.norm(grad, 2.0)`` when known without a read (a new 0-d tensor on the
        parameter's device), else None."""
        self._sync_mem(s)
        n = s.grad_norm
        if n is None or s.device.type != "cpu":
            return None  # (a CUDA gradient's norm is computed on its device)
        return n.clone()

    def materialize(self, s: ParamRecord) -> torch.Tensor:
        """The gradient's values as a tensor of the parameter's shape and device (read from
        the store unless in memory), kept in memory (edits are kept) within the budget."""
        if s.grad_mem is not None:
            return s.grad_mem
        self._check_kept(s)
        self._edited(s)  # (it may be edited in memory from now on)
        if s.owned is not None:
            raise RuntimeError(
                f"offloaded parameter {s.name!r}: its gradient is partitioned over the ranks "
                "(ZeRO-3): each rank holds the reduced sum of its slice only, so p.grad's "
                "values cannot be read or edited (scaling, zeroing and p.grad = None work); "
                "read this rank's slice with ParameterOffload.grad(p), or clip with the "
                "optimizer's max_grad_norm=")
        g = self._read_stored(s) if s.has_grad else None
        if g is None:
            raise RuntimeError(f"offloaded parameter {s.name!r} has no gradient")
        if s.owned is None:
            g = g.view(s.shape)
        g = g.to(s.device)
        dirty = bool(s.grad_zero or s.grad_ops)  # the stored object lacks these
        s.grad_ops = []
        self._hold(s, g)
        s.grad_dirty = dirty
        s.grad_mark = g._version
        if s.grad_norm is None or s.grad_finite is None:
            s.grad_mark = -1
        return g

    # ---- zero_grad -----------------------------------------------------------------------

    def zero(self, set_to_none: bool) -> None:
        """Every stored gradient as torch's ``zero_grad(set_to_none)`` leaves ``p.grad``:
        zeros (torch 1.13's default: the parameter is still stepped, with a zero
        gradient, and the next backward adds to zero) or none."""
        self.flush()
        for s in self.records:
            if set_to_none or not s.has_grad:
                self._drop(s)
            else:
                self.zero_one(s)

    # ---- the materialized gradients ----------------------------------------------------------

    def _hold(self, s: ParamRecord, g: torch.Tensor) -> None:
        nbytes = g.numel() * g.element_size()
        while self._materialized and self._materialized_bytes + nbytes > self.inflight_budget:
            self._evict(next(iter(self._materialized.values())))
        s.grad_mem = g
        s.has_grad = True
        self._materialized[id(s)] = s
        self._materialized_bytes += nbytes

    def _sync_mem(self, s: ParamRecord) -> None:
        """Norm and finiteness of a materialized gradient changed since they were taken."""
        g = s.grad_mem
        if g is not None and g._version != s.grad_mark:
            with _no_tf():
                s.grad_norm = torch.norm(g.detach(), 2.0).cpu()
                s.grad_finite = all_finite(g, s.grad_norm)
            s.grad_mark = g._version
            s.grad_dirty = True
            s.grad_sum = False  # edited: the step takes p.grad

    def _evict(self, s: ParamRecord) -> None:
        """A materialized gradient stored back (when it differs from the stored one) and
        released."""
        self._sync_mem(s)
        g = s.grad_mem
        if s.grad_dirty:
            with _no_tf():
                flat = g.detach().reshape(-1).cpu().contiguous().clone()
            self._release_mem(s)
            self._write(s, flat)
        else:
            self._release_mem(s)

    def _release_mem(self, s: ParamRecord) -> None:
        g = s.grad_mem
        if g is not None:
            self._materialized.pop(id(s), None)
            self._materialized_bytes -= g.numel() * g.element_size()
        s.grad_mem = None
        s.grad_dirty = False

    @staticmethod
    def _edited(s: ParamRecord) -> None:
        """The gradient an update in backward took changes: the linked optimizer redoes."""
        if s.grad_early is not None and s.link is not None:
            s.link.edited(s.param)

    def _forget_values(self, s: ParamRecord) -> None:
        """The gradient's values are replaced: recorded scalings, the materialized copy and
        the one held in host memory dropped."""
        self._edited(s)
        s.grad_early = None
        self._release_mem(s)
        self.host.release(s)
        s.grad_ops = []
        s.grad_zero = False
        s.grad_sum = False

    def _drop(self, s: ParamRecord) -> None:
        """No stored gradient (``p.grad = None``; the OffloadedGrad of the old one is
        forgotten, as torch forgets the old tensor)."""
        self._forget_values(s)
        s.has_grad = False
        s.grad_norm = None
        s.grad_finite = True
        s.grad_obj = None
