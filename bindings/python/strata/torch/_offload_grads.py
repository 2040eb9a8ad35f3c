"""Gradients of offloaded parameters (strata.torch.offload_parameters): moved to the store
as torch produces them, reduce-scattered to their owners over ranks, read back by the
optimizer's step; torch's accumulation and zero_grad semantics (see _param_offload.py).

Thread-safety: as ParameterOffload (the training thread; hooks run on torch's autograd
thread, the caller's for CPU models).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ._finite import all_finite
from ._working_set import Slot, tensor_of

_no_tf = torch._C.DisableTorchFunction


class GradientsMixin:
    """The gradient half of ParameterOffload (uses its store, ws, comm, tier,
    working_set_bytes, average_gradients, _stats, _grad_writes, _grad_inflight,
    _accumulators, _clip, _backward_phase, _slot)."""

    def bind_optimizer(self, p: Any, clip: bool) -> None:
        """A strata optimizer holds ``p``: its gradients go to the store from now on
        (``clip``: their L2 norms are kept for clipping). Called by OffloadAdam/AdamW."""
        s = p._strata_slot
        s.to_store = True
        self._clip = getattr(self, "_clip", False) or clip
        if p.requires_grad and not any(a[0] is s for a in self._accumulators):
            with _no_tf():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._grad_hook(s))
            self._accumulators.append((s, acc))

    def _grad_hook(self, s: Slot):
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            self._grad_ready(s)
        return hook

    def _grad_ready(self, s: Slot) -> None:
        """``s.param.grad`` was accumulated by torch: moved to the store (added to the
        stored one when this step already has one, as torch's ``p.grad += g``)."""
        if not s.to_store:
            return
        self._backward_phase()
        p = s.param
        with _no_tf():
            g = p.grad
            if g is None:
                return
            p.grad = None
            g = g.detach()
            if g.is_sparse:
                raise RuntimeError(f"offloaded parameter {s.name!r}: sparse gradients are "
                                   "not supported")
            if g.device.type != "cpu":
                g = g.cpu()
            if self.comm is not None:  # ZeRO-3: every rank gets the sum of its slice
                g = self._reduce_scatter(s, g)
            if s.has_grad and s.grad_zero:  # torch: zeroed grad += g
                g = g.reshape(-1).add(0.0)
                s.grad_zero = False
            elif s.has_grad:
                old = self._read_grad(s)
                old.add_(g.reshape(-1))
                g = old
            else:
                g = g.contiguous()
            s.has_grad = True
            s.grad_norm = torch.norm(g, 2.0) if self._clip else None
            s.grad_finite = all_finite(g, s.grad_norm)
        self._write_grad(s, g)

    def _reduce_scatter(self, s: Slot, g: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of the elements of ``g`` this rank owns (divided by the
        number of ranks with average_gradients, as DDP averages), 1-d."""
        out = torch.empty(s.state_numel, dtype=s.dtype)
        self.comm.reduce_scatter_grads(g.reshape(-1).contiguous(), out)
        if self.average_gradients:
            out.div_(self.comm.size)
        return out

    def _write_grad(self, s: Slot, g: torch.Tensor) -> None:
        nbytes = g.numel() * g.element_size()
        while self._grad_writes and self._grad_inflight + nbytes > self.working_set_bytes // 2:
            self._wait_grad(next(iter(self._grad_writes)))
        if g.numel() == 0:  # a rank owning no element of a small parameter
            return
        fut = self.store.put_async(s.grad_key, g.reshape(-1), tier=self.tier, overwrite=True)
        self._grad_writes[s.index] = (fut, g)
        self._grad_inflight += nbytes
        self._stats["grad_bytes_written"] += nbytes

    def _wait_grad(self, index: int) -> None:
        fut, g = self._grad_writes.pop(index)
        self._grad_inflight -= g.numel() * g.element_size()
        fut.result()

    def collect_grads(self) -> None:
        """Gradients still in ``p.grad`` of parameters whose gradients go to the store (a
        parameter that did not require grad when the optimizer took it, so that no hook
        watched it) moved to the store as the hook would have; then flush_grads()."""
        for s in self.ws.slots:
            if s.to_store:
                with _no_tf():
                    has = s.param.grad is not None
                if has:
                    self._grad_ready(s)
        self.flush_grads()

    def flush_grads(self) -> None:
        """Waits for every gradient write in flight (errors are raised here)."""
        while self._grad_writes:
            self._wait_grad(next(iter(self._grad_writes)))

    def _read_grad(self, s: Slot) -> torch.Tensor:
        if s.grad_zero:
            return torch.zeros(s.state_numel, dtype=s.dtype)
        if s.index in self._grad_writes:
            self._wait_grad(s.index)
        if s.state_numel == 0:
            return torch.zeros(0, dtype=s.dtype)
        g = tensor_of(self.store._s.get(s.grad_key), s.dtype)
        self._stats["grad_bytes_read"] += g.numel() * g.element_size()
        return g

    def grad(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """The gradient of offloaded parameter ``p`` accumulated since the last zero_grad
        (a new CPU tensor of its shape and dtype; with a communicator this rank's slice,
        1-d, reduced over the ranks), or ``p.grad`` when its gradients stay in memory; None
        when it has none.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._slot(p)
        if not s.to_store:
            with _no_tf():
                return p.grad
        if not s.has_grad:
            return None
        g = self._read_grad(s)
        return g if s.owned is not None else g.view(s.shape)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """The stored gradients as torch's ``zero_grad(set_to_none)`` leaves ``p.grad``:
        zeros (torch 1.13's default: the parameter is still stepped, with a zero
        gradient, and the next backward adds to zero) or none. Called by the model's and
        strata optimizers' ``zero_grad``."""
        self.flush_grads()
        for s in self.ws.slots:
            if set_to_none or not s.has_grad:
                s.has_grad = False
                s.grad_zero = False
                s.grad_norm = None
            else:
                s.grad_zero = True
                s.grad_norm = torch.zeros((), dtype=torch.float32)
            s.grad_finite = True
