"""One step of strata.torch's optimizers after step() has synced param_groups,
hyperparameters and optimizer.state: which of the three paths runs, and the gradients and
weights each moves.

* offloaded parameters (strata.torch.offload_parameters) among them: the step in batches
  of optim/_offloaded_step.py (gradients from the store);
* an overlapped step open (``overlap_backward=True``: updates started in backward):
  the gradients not started are attached and the step is finished (optim/_overlap.py);
* else the ordinary step: every gradient attached (optim/_exchange.py), strata's step.

Every path's gate (skip on inf/NaN, clipping) is strata's C++ one (optim/_gate.py).

Thread-safety: the optimizer's (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..offload import is_offloaded
from ._exchange import TensorExchange
from ._gate import torch_summary
from ._offloaded_step import finish_offloaded, offloaded_step
from ._overlap import BackwardOverlap
from .._trace import traced
from ._param_table import ParamTable

#: (parameter, strata handle) of each parameter whose weights the step wrote
Stepped = List[Tuple[torch.nn.Parameter, int]]


@traced("step", "optimizer")
def run_step(table: ParamTable, exchange: TensorExchange, overlap: Optional[BackwardOverlap],
             max_grad_norm: float, torch_arithmetic: bool, grad_scale: float = 1.0
             ) -> Tuple[Dict[str, Any], Stepped, bool]:
    """Runs the step's path (see the module doc).

    :param overlap: the optimizer's BackwardOverlap (None without overlap_backward).
    :param torch_arithmetic: ``arithmetic="torch"``: the clipping norm is torch's.
    :param grad_scale: every gradient's factor (1/loss scale: optim/_loss_scale.py), applied
        in fp32 inside the update kernels and to the clipping norm (strata's gate); an
        overlapped step is not open when it is not 1 (the loss scaler refuses overlap).
    :returns: strata's step statistics, the in-memory parameters stepped (whose weights
        the caller counts and copies back), and whether CUDA copies were queued (the caller
        synchronizes after its copy-back).
    """
    table.accum.watch(table.params)  # fp16/bf16 parameters added since (idempotent)
    if any(is_offloaded(p) for p in table.params):
        if overlap is not None and overlap.open:  # updates started in backward
            stats, stepped = finish_offloaded(table, exchange, overlap, max_grad_norm)
        else:
            stats, stepped = offloaded_step(table, exchange, max_grad_norm,
                                            overlap.abort_reason if overlap else "", grad_scale)
        return stats, stepped, False
    overlapped = overlap is not None and overlap.open
    core = table.core
    accum = table.accum
    on_gpu = False
    stepped: Stepped = []
    grads: List[torch.Tensor] = []
    for p in table.params:
        g = accum.grad(p)  # p.grad, or its fp32 sum (fp16/bf16: optim/_grad_accum.py)
        if g is not None:
            grads.append(g)
        if overlapped and overlap.is_started(p):
            continue  # attached by the early update; its weights come from the staging
        h = table.handle[id(p)]
        if g is None:
            exchange.detach(core, h)
            continue
        on_gpu |= exchange.attach(core, p, h, g)
        stepped.append((p, h))
    if on_gpu:
        torch.cuda.synchronize()
    summary = torch_summary(grads, max_grad_norm) if torch_arithmetic else None
    if overlapped:
        stats = overlap.finish(max_grad_norm, summary)
    else:
        stats = core.step(max_grad_norm=max_grad_norm, grad_scale=grad_scale,
                          grad_summary=summary)
    return stats, stepped, on_gpu
