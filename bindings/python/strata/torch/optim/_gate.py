"""The inputs of a step's gate where strata's C++ step cannot scan the gradients itself.

The gate -- skip a step whose gradients hold an inf or NaN, clip by global L2 norm -- is
decided in one place for every path, strata's C++ ``decide_gate`` (grad_utils.hpp): inside
the ordinary and the overlapped step (OffloadedOptimizer::step / finish_step), and, for the
step over offloaded parameters, called once before its batches (``strata._strata
.decide_gate``). What it decides from:

* the ordinary and overlapped steps with ``arithmetic="simd"``: the attached gradients,
  scanned by the C++ step (an fp64 norm: GradNormAccumulator);
* with ``arithmetic="torch"`` and clipping, and for the step over offloaded parameters (whose
  gradients are never all attached at once, and may be partitioned over ranks): the summary
  made here -- the norm as ``torch.nn.utils.clip_grad_norm_`` computes it (``torch.norm`` of
  each gradient, fp32, then the norm of their stack, in the model's parameter order; over
  ranks the square root of the all-reduced sum of the slices' squared norms) and whether any
  gradient is non-finite (all-reduced over ranks). The C++ gate then takes torch's fp32
  coefficient, so results are bit-identical to ``clip_grad_norm_`` then torch.optim's step.

Thread-safety: pure functions (one collective per call with a communicator: every rank
calls in the same order).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from .._common import all_finite

#: (grad_norm, nonfinite, arithmetic): what strata's step takes as ``grad_summary``
Summary = Tuple[float, bool, str]


def summarize(norms: List[torch.Tensor], finite: bool, comm: Any = None,
              need_norm: bool = True) -> Summary:
    """The gate's inputs from per-gradient norms.

    :param norms: ``torch.norm(g, 2.0)`` of every gradient of the step (0-d fp32 tensors),
        in the model's parameter order; with ``comm`` each rank's slices' norms.
    :param finite: every element of every gradient (of this rank) is finite.
    :param comm: a strata.distributed.Communicator (ZeRO-3) or None: the finiteness flag is
        all-reduced (MAX of "non-finite") and the norm is sqrt(all-reduced sum of squares).
    :param need_norm: False when clipping is off: no norm is computed (0.0 is returned).
    :returns: ``(grad_norm, nonfinite, "torch")``.
    """
    if comm is not None:  # every rank steps (or skips) alike
        flag = torch.tensor([0.0 if finite else 1.0])
        comm.all_reduce(flag, op="max")
        finite = flag.item() == 0.0
    if not need_norm:
        return (0.0, not finite, "torch")
    if comm is not None:
        # partitioned gradients: sqrt(sum over ranks of each slice's squared norm)
        sq = torch.zeros((), dtype=torch.float32)
        for n in norms:
            sq = sq + n * n
        sq = sq.reshape(1)
        comm.all_reduce(sq)
        total = sq.sqrt()[0]
    elif norms:
        total = torch.norm(torch.stack(norms), 2.0)
    else:
        total = torch.zeros((), dtype=torch.float32)
    return (float(total), not finite, "torch")


def torch_summary(grads: List[torch.Tensor], max_grad_norm: float) -> Optional[Summary]:
    """The summary of in-memory gradients for a step with ``arithmetic="torch"``: None
    when clipping is off (the C++ step's own scan for inf/NaN is exact in any
    arithmetic), else torch's norm over ``grads`` (in the optimizer's parameter order,
    which is the model's when the optimizer was given ``model.parameters()``).

    :param grads: the gradients of the step (any device, dtype, layout).
    """
    if not max_grad_norm > 0:
        return None
    norms = [torch.norm(g.detach(), 2.0) for g in grads]
    finite = all(all_finite(g, n) for g, n in zip(grads, norms))
    device = grads[0].device if grads else "cpu"  # as clip_grad_norm_: on the first's
    return summarize([n.to(device) for n in norms], finite)
