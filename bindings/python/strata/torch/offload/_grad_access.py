"""The gradients of a ParameterOffload as the optimizer wing reaches them: the part of
ParameterOffload (offload/_handle.py) that delegates to its GradientStore
(offload/_grads.py): binding an optimizer (and taking the gradient an optimizer that held
the parameter in memory accumulated before the offload), what is known of a gradient,
reading it, moving gradients still in ``p.grad``, zero_grad.

Thread-safety: as ParameterOffload (one thread at a time).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._common import no_torch_function as _no_tf
from .._trace import traced
from ._grad_sum import store_sum
from ._grads import GradInfo


class GradAccess:
    """Mixin of ParameterOffload (needs its ``_record`` and ``grads``)."""

    # ---- gradients (the GradientStore ``grads``) -------------------------------------------

    def bind_optimizer(self, p: torch.Tensor, fp32_sums: bool = False) -> None:
        """A strata optimizer holds ``p``: its gradients go to the store from now on, moved
        there as soon as torch has accumulated each (with their L2 norms and finiteness),
        and ``p.grad`` is the stored gradient (offload/_grad_tensor.py). ``fp32_sums``: an
        fp16/bf16 ``p``'s micro-batch gradients are summed in fp32 in the store from the
        next backward on (the optimizer's ``grad_accumulation_dtype=torch.float32``;
        offload/_grad_sum.py); False: in ``p``'s dtype, as torch. Called by OffloadAdam/AdamW
        at registration and at each step; idempotent.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        self.grads.bind(self._record(p), fp32_sums)

    def adopt_grad(self, p: torch.Tensor, fp32_sum: Optional[torch.Tensor] = None) -> None:
        """Just offloaded and bound (:meth:`bind_optimizer`) by an optimizer that held ``p``
        in memory: the gradient accumulated in memory before the offload (``p.grad``) goes
        to the store now, so the next backward adds to it there (in fp32 for fp32 sums):
        ``fp32_sum`` when given (the optimizer's fp32 sum of those micro-batches, ``p``'s
        shape and device, ``p.grad`` holding it rounded; offload/_grad_sum.py) and ``p``'s
        gradients are summed in fp32, else ``p.grad`` (widened for fp32 sums: exact for one
        micro-batch's gradient; a tiled ``p`` always takes ``p.grad``). Nothing without a
        gradient in ``p.grad`` or when ``p`` is not bound. With a communicator: a
        collective (reduce-scatter) when ``p.grad`` is set.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        with _no_tf():
            has = p.grad is not None
        if not (s.to_store and has):
            return
        if fp32_sum is not None and s.grad_acc32 and not s.has_grad and s.tile is None:
            store_sum(self.grads, s, fp32_sum)
        else:  # as the hook after a backward
            self.grads._grad_ready(s, in_backward=False)

    def grad_info(self, p: torch.Tensor) -> GradInfo:
        """What is known of ``p``'s gradient since the last zero_grad without reading it:
        has_grad, finite, norm (see :class:`GradInfo`).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self.grads.info(self._record(p))

    @traced("read_grad", "store")
    def read_grad(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s accumulated gradient as the optimizer steps it: a new 1-d CPU tensor of
        ``state_numel(p)`` elements (this rank's reduced slice with a communicator; zeros
        after ``zero_grad(set_to_none=False)``), fp32 when it is the fp32 sum of an
        fp16/bf16 ``p``'s micro-batch gradients and ``p.grad`` was not edited since
        (offload/_grad_sum.py), else of ``p``'s dtype. Only for a parameter with
        ``grad_info(p).has_grad``.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self.grads.read_for_step(self._record(p))

    def grad_stored(self, p: torch.Tensor) -> bool:
        """``p``'s gradient values can be read (False when an update in backward took it
        without storing it: offload/_grads.py).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).grad_early != "dropped"

    def grad(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """The gradient of offloaded parameter ``p`` accumulated since the last zero_grad
        (a new CPU tensor of its shape and dtype; with a communicator this rank's slice,
        1-d, reduced over the ranks), or ``p.grad`` when its gradients stay in memory; None
        when it has none.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        if not s.to_store:
            with _no_tf():
                return p.grad
        if not s.has_grad:
            return None
        g = self.grads.read(s).clone()
        return g if s.owned is not None else g.view(s.shape)

    def collect_grads(self) -> None:
        """Gradients still in ``p.grad`` of parameters whose gradients go to the store (one
        that did not require grad when the optimizer took it) moved to the store, then
        every write in flight waited for (its errors raised here)."""
        self.grads.collect()

    def flush_grads(self) -> None:
        """Waits for every gradient write in flight (errors are raised here)."""
        self.grads.flush()

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Every stored gradient of this offload as torch's ``zero_grad(set_to_none)``
        leaves ``p.grad``: zeros (torch 1.13's default: the parameter is still stepped, with
        a zero gradient, and the next backward adds to zero) or none. (``model.zero_grad()``
        and an optimizer's ``zero_grad()`` do the same for their parameters through
        ``p.grad``.)"""
        self.grads.zero(set_to_none)
