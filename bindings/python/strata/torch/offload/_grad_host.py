"""Gradient sums held in host memory between micro-batches (offload_parameters'
``grad_host_budget``): the part of the gradient store (offload/_grads.py) that holds, within
a byte budget, the gradients that would otherwise be written to the store after each
micro-batch and read back by the next one and by the step.

The rule: a gradient about to be stored (``GradientStore._write``: a backward's sum, a
materialized gradient stored back) is held instead when its bytes fit in what the budget
has left (first come, first held; never more than the budget in all); a held one is
replaced by its new sum (the same bytes: it stays held); the others go to the store as
without a budget. A held gradient is the parameter's gradient (the store object, if any,
is stale): reads (the next micro-batch's sum, ``p.grad``, the step) copy it or add to it
and count no store bytes. It is released when its values are replaced or dropped
(``zero_grad`` either form, ``p.grad = None`` / ``= t``, the offload's close), which frees
its bytes for the next backward: with the same parameters in the same backward order every
step, the same ones are held.

Held: flat CPU tensors of ``state_numel`` elements (this rank's reduced slice under ZeRO-3)
of the stored object's dtype (fp32 for the fp32 sum of an fp16/bf16 parameter,
offload/_grad_sum.py). Never held: tiled parameters (their gradient object is written
block by block: offload/_tiled_grads.py) and empty slices.

Store bytes per parameter element per micro-batch (fp32, ``k`` micro-batches per step):
held, 0 written and 0 read; stored, 4 written by each micro-batch and 4 read by each of the
``k - 1`` later ones and by the step (``4k`` written and ``4k`` read per step).

Thread-safety: as the gradient store (the training thread; autograd's for the hooks).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ._record import ParamRecord


class HostGrads:
    """The gradients of one GradientStore held in host memory.

    :param budget: bytes of held gradients at most (0: none is held).
    """

    def __init__(self, budget: int):
        #: bytes of held gradients at most
        self.budget = int(budget)
        #: bytes of the gradients held now
        self.used = 0
        self._held: Dict[int, Tuple[ParamRecord, torch.Tensor]] = {}  # id(record) -> ...

    def hold(self, s: ParamRecord, g: torch.Tensor, owned: bool) -> bool:
        """``g`` (flat, CPU, contiguous: the gradient ``s`` would store) becomes ``s``'s
        held gradient when it fits in the budget (the one ``s`` held is released first);
        ``owned``: ``g`` is referenced nowhere else (else a copy is held). Returns False
        when it is not held (the caller stores it)."""
        self.release(s)
        nbytes = g.numel() * g.element_size()
        if (nbytes == 0 or s.tile is not None or g.device.type != "cpu"
                or self.used + nbytes > self.budget):
            return False
        self._held[id(s)] = (s, g if owned else g.clone())
        self.used += nbytes
        return True

    def get(self, s: ParamRecord) -> Optional[torch.Tensor]:
        """``s``'s held gradient (the tensor itself: the caller copies it before a change),
        or None."""
        e = self._held.get(id(s))
        return None if e is None else e[1]

    def take(self, s: ParamRecord, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """``s``'s held gradient when it has ``dtype``, released (the caller owns it, and
        holds or stores its new sum), else None (nothing changes)."""
        e = self._held.get(id(s))
        if e is None or e[1].dtype != dtype:
            return None
        self.release(s)
        return e[1]

    def release(self, s: ParamRecord) -> None:
        """``s`` holds no gradient from now on (its bytes freed)."""
        e = self._held.pop(id(s), None)
        if e is not None:
            self.used -= e[1].numel() * e[1].element_size()
