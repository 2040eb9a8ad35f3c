"""The gradient store of parameter offload (strata.torch.offload_parameters): gradients of
offloaded parameters moved to the store as torch produces them, reduce-scattered to their
owners over ranks, read back by the optimizer's step; torch's accumulation and zero_grad
semantics (see offload/_handle.py).

Thread-safety: as ParameterOffload (the training thread; hooks run on torch's autograd
thread, the caller's for CPU models).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from .._common import all_finite, host_grad, no_torch_function as _no_tf, watch_accumulation
from ._record import ParamRecord, tensor_of


class GradInfo(NamedTuple):
    """What the gradient store knows of one parameter's gradient since the last zero_grad
    (:meth:`ParameterOffload.grad_info`)."""

    #: a gradient was accumulated (or zeroed by ``zero_grad(set_to_none=False)``)
    has_grad: bool
    #: every element is finite (True without a gradient)
    finite: bool
    #: ``torch.norm(grad, 2.0)`` (0-d fp32; this rank's slice when partitioned) when the
    #: optimizer asked for norms (clipping), else None
    norm: Optional[torch.Tensor]


class GradientStore:
    """The gradients of one ParameterOffload's parameters that a strata optimizer holds.

    :param store: the strata.Store holding them (``<key>#grad`` objects).
    :param records: the offload's ParamRecords (the list itself, which the offload edits).
    :param tier: the store tier of the gradient objects.
    :param inflight_budget: bytes of gradient writes in flight at most (half the working
        set).
    :param comm: a Communicator (ZeRO-3: gradients are reduce-scattered) or None.
    :param average_gradients: with ``comm``, divide the reduced sums by the rank count.
    :param stats: the offload's counters (``grad_bytes_written``/``grad_bytes_read``).
    :param on_backward: called first in each gradient hook (the offload's backward phase).
    """

    def __init__(self, store: Any, records: List[ParamRecord], tier: str, inflight_budget: int,
                 comm: Any, average_gradients: bool, stats: Dict[str, float],
                 on_backward: Callable[[], None]):
        self.store, self.tier, self.comm = store, tier, comm
        self.records = records  # the offload's list (records are appended there)
        self.inflight_budget = inflight_budget
        self.average_gradients = average_gradients
        self.stats = stats  # the offload's counters, updated in place
        self._on_backward = on_backward
        self._writes: Dict[int, Tuple[Any, torch.Tensor]] = {}  # record index -> (future, grad)
        self._inflight = 0
        self._accumulators: List[Tuple[ParamRecord, Any]] = []
        #: keep each gradient's L2 norm (an optimizer clips)
        self.keep_norms = False

    def bind(self, s: ParamRecord, keep_norms: bool) -> None:
        """A strata optimizer holds ``s``'s parameter: its gradients go to the store from
        now on (``keep_norms``: their L2 norms are kept for clipping)."""
        s.to_store = True
        self.keep_norms = self.keep_norms or keep_norms
        p = s.param
        if p.requires_grad and not any(a[0] is s for a in self._accumulators):
            acc = watch_accumulation(p, lambda s=s: self._grad_ready(s))
            self._accumulators.append((s, acc))

    def _grad_ready(self, s: ParamRecord) -> None:
        """``s.param.grad`` was accumulated by torch: moved to the store (added to the
        stored one when this step already has one, as torch's ``p.grad += g``)."""
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
            if self.comm is not None:  # ZeRO-3: every rank gets the sum of its slice
                g = self._reduce_scatter(s, g)
            if s.has_grad and s.grad_zero:  # torch: zeroed grad += g
                g = g.add(0.0)
                s.grad_zero = False
            elif s.has_grad:
                old = self.read(s)
                old.add_(g)
                g = old
            s.has_grad = True
            s.grad_norm = torch.norm(g, 2.0) if self.keep_norms else None
            s.grad_finite = all_finite(g, s.grad_norm)
        self._write(s, g)

    def _reduce_scatter(self, s: ParamRecord, g: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of the elements of ``g`` this rank owns (divided by the
        number of ranks with average_gradients, as DDP averages), 1-d."""
        out = torch.empty(s.state_numel, dtype=s.dtype)
        self.comm.reduce_scatter_grads(g, out)
        if self.average_gradients:
            out.div_(self.comm.size)
        return out

    def _write(self, s: ParamRecord, g: torch.Tensor) -> None:
        nbytes = g.numel() * g.element_size()
        while self._writes and self._inflight + nbytes > self.inflight_budget:
            self._wait(next(iter(self._writes)))
        if g.numel() == 0:  # a rank owning no element of a small parameter
            return
        fut = self.store.put_async(s.grad_key, g, tier=self.tier, overwrite=True)
        self._writes[s.index] = (fut, g)
        self._inflight += nbytes
        self.stats["grad_bytes_written"] += nbytes

    def _wait(self, index: int) -> None:
        fut, g = self._writes.pop(index)
        self._inflight -= g.numel() * g.element_size()
        fut.result()

    def collect(self) -> None:
        """Gradients still in ``p.grad`` of parameters whose gradients go to the store (a
        parameter that did not require grad when the optimizer took it, so that no hook
        watched it) moved to the store as the hook would have; then flush()."""
        for s in self.records:
            if s.to_store:
                with _no_tf():
                    has = s.param.grad is not None
                if has:
                    self._grad_ready(s)
        self.flush()

    def flush(self) -> None:
        """Waits for every gradient write in flight (errors are raised here)."""
        while self._writes:
            self._wait(next(iter(self._writes)))

    def read(self, s: ParamRecord) -> torch.Tensor:
        """``s``'s accumulated gradient, a new flat tensor of ``s.state_numel`` elements of
        the parameter's dtype (zeros after ``zero_grad(set_to_none=False)``)."""
        if s.grad_zero:
            return torch.zeros(s.state_numel, dtype=s.dtype)
        if s.index in self._writes:
            self._wait(s.index)
        if s.state_numel == 0:
            return torch.zeros(0, dtype=s.dtype)
        g = tensor_of(self.store.get(s.grad_key), s.dtype)
        self.stats["grad_bytes_read"] += g.numel() * g.element_size()
        return g

    def info(self, s: ParamRecord) -> GradInfo:
        """``s``'s gradient bookkeeping (no I/O)."""
        return GradInfo(s.has_grad, s.grad_finite, s.grad_norm)

    def zero(self, set_to_none: bool) -> None:
        """The stored gradients as torch's ``zero_grad(set_to_none)`` leaves ``p.grad``:
        zeros (torch 1.13's default: the parameter is still stepped, with a zero
        gradient, and the next backward adds to zero) or none."""
        self.flush()
        for s in self.records:
            if set_to_none or not s.has_grad:
                s.has_grad = False
                s.grad_zero = False
                s.grad_norm = None
            else:
                s.grad_zero = True
                s.grad_norm = torch.zeros((), dtype=torch.float32)
            s.grad_finite = True
