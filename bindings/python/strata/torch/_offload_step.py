"""The step of OffloadAdam/OffloadAdamW over offloaded parameters
(strata.torch.offload_parameters): gradients from the store, updated weights into the
parameters' store objects, in batches bounded by the working set.

The gate is torch's. A step is skipped (nothing changes, ``last_step["skipped"]``) when any
gradient holds an inf or NaN, as strata's ordinary step. Clipping (``max_grad_norm``) is
``torch.nn.utils.clip_grad_norm_``'s arithmetic exactly (torch 1.13): the L2 norm of each
gradient (``torch.norm(g, 2)``, fp32, taken when it reached the store), the norm of their
stack (in the model's parameter order, as ``clip_grad_norm_(model.parameters())``
stacks them), ``coef = max_norm / (total + 1e-6)`` clamped to 1, every gradient multiplied by
it; so results are bit-identical to ``clip_grad_norm_`` then torch.optim's step.

Batches. Parameters are stepped in batches whose gradient and weight buffers together
take at most the working set's bytes (a parameter larger than that alone): each batch's
gradients are read from the store, attached to strata's optimizer, stepped (its masters and
moments stream through strata's pipeline as in any step; each tensor keeps its own step
count, so batching changes no value), and the updated weights (the kernel's rounding to
the parameter's dtype) are stored as the parameters' new values. The parameters' working
set is released first (the step changes every value).

Thread-safety: the optimizer's (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ._finite import all_finite
from ._param_offload import OffloadedParameter

_SUMMED = ("bytes_read", "bytes_written", "tensors_updated", "numel_updated", "seconds",
           "compute_seconds", "io_wait_seconds")


def has_offloaded(params: List[torch.Tensor]) -> bool:
    """Any of ``params`` is an offloaded parameter."""
    return any(type(p) is OffloadedParameter for p in params)


def owners(params: List[torch.Tensor]) -> List[Any]:
    """The ParameterOffload objects of the offloaded ones of ``params`` (each once)."""
    seen: Dict[int, Any] = {}
    for p in params:
        if type(p) is OffloadedParameter:
            seen.setdefault(id(p._strata_owner), p._strata_owner)
    return list(seen.values())


def state_numel(p: torch.Tensor) -> int:
    """Elements the optimizer holds of ``p``: an offloaded parameter partitioned over ranks
    (ZeRO-3) only this rank's slice, any other parameter all."""
    if type(p) is OffloadedParameter:
        return p._strata_slot.state_numel
    return p.numel()


def _grad_of(p: torch.Tensor) -> Optional[torch.Tensor]:
    """In-memory gradient of a parameter that is not offloaded (None for offloaded ones)."""
    if type(p) is OffloadedParameter:
        return None
    return p.grad


def _model_order(entry: Tuple[torch.Tensor, int]) -> Tuple[int, int, int]:
    """Offloaded parameters in their model's order (``model.parameters()``, as
    ``clip_grad_norm_(model.parameters())`` stacks their norms), then the others in the
    optimizer's."""
    p, h = entry
    if type(p) is OffloadedParameter:
        return (0, id(p._strata_owner), p._strata_slot.index)
    return (1, 0, h)


def offloaded_step(opt: Any) -> Tuple[Dict[str, Any], List[Tuple[torch.Tensor, int]]]:
    """One step of ``opt`` (an _OffloadAdamBase holding offloaded parameters; its
    param_groups, hyperparameters and optimizer.state already synced by step()).

    :returns: strata's step statistics summed over the batches (``skipped``, ``grad_norm``
        and ``clip_coef`` as the ordinary step reports them), and the in-memory parameters
        stepped (for the caller's copy-back, as in the ordinary step).
    :raises strata.Error: the store's errors; parameters stepped in earlier batches keep
        their new values (as a failed ordinary step, resume from the last checkpoint).
    """
    holders = owners(opt._params)
    for o in holders:
        o.collect_grads()
    entries: List[Tuple[torch.Tensor, int]] = []  # (param, handle) with a gradient
    for p in opt._params:
        h = opt._handle[id(p)]
        if type(p) is OffloadedParameter:
            if p._strata_slot.has_grad:
                entries.append((p, h))
            continue
        if p.grad is not None:
            entries.append((p, h))
    stats: Dict[str, Any] = dict(skipped=False, grad_norm=float("nan"), clip_coef=1.0)
    for k in _SUMMED:
        stats[k] = 0
    finite = True
    for p, _ in entries:
        if type(p) is OffloadedParameter:
            finite &= p._strata_slot.grad_finite
        else:
            finite &= all_finite(p.grad)
    comm = next((o.comm for o in holders if o.comm is not None), None)
    if comm is not None and any(type(p) is not OffloadedParameter for p, _ in entries):
        raise ValueError("an optimizer over parameters offloaded with a communicator (ZeRO-3) "
                         "must hold only such parameters: the gradients of the others are "
                         "not reduced over the ranks")
    if comm is not None:  # every rank steps (or skips) alike
        flag = torch.tensor([0.0 if finite else 1.0])
        comm.all_reduce(flag, op="max")
        finite = flag.item() == 0.0
    coef = None
    if opt.max_grad_norm > 0 and comm is not None:
        # partitioned gradients: sqrt(sum over ranks of each slice's squared norm)
        sq = torch.zeros((), dtype=torch.float32)
        for p, _ in sorted(entries, key=_model_order):
            if type(p) is OffloadedParameter:
                s = p._strata_slot
                n = s.grad_norm if s.grad_norm is not None else torch.norm(
                    p._strata_owner._read_grad(s), 2.0)
            sq = sq + n * n
        sq = sq.reshape(1)
        comm.all_reduce(sq)
        total = sq.sqrt()[0]
        stats["grad_norm"] = float(total)
        coef = torch.clamp(opt.max_grad_norm / (total + 1e-6), max=1.0)
        stats["clip_coef"] = float(coef)
    elif opt.max_grad_norm > 0 and entries:
        norms = []
        for p, _ in sorted(entries, key=_model_order):
            if type(p) is OffloadedParameter:
                s = p._strata_slot
                norms.append(s.grad_norm if s.grad_norm is not None
                             else torch.norm(p._strata_owner._read_grad(s), 2.0))
            else:
                norms.append(torch.norm(p.grad.detach(), 2.0))
        total = torch.norm(torch.stack(norms), 2.0)
        stats["grad_norm"] = float(total)
        coef = torch.clamp(opt.max_grad_norm / (total + 1e-6), max=1.0)
        stats["clip_coef"] = float(coef)
    if not finite:
        stats["skipped"] = True
        return stats, []
    for o in holders:
        o.ws.release_all()
    budget = min(o.working_set_bytes for o in holders)
    memory: List[Tuple[torch.Tensor, int]] = []
    batch: List[Tuple[torch.Tensor, int]] = []
    used = 0
    for p, h in entries:
        if type(p) is not OffloadedParameter:
            memory.append((p, h))
            continue
        need = p._strata_slot.state_numel * 4 * 2
        if batch and used + need > budget:
            _run_batch(opt, batch, memory, coef, stats)
            memory, batch, used = [], [], 0
        batch.append((p, h))
        used += need
    if batch or memory:
        _run_batch(opt, batch, memory, coef, stats)
    return stats, [(p, h) for p, h in entries if type(p) is not OffloadedParameter]


def _run_batch(opt: Any, batch: List[Tuple[torch.Tensor, int]],
               memory: List[Tuple[torch.Tensor, int]], coef: Optional[torch.Tensor],
               stats: Dict[str, Any]) -> None:
    """Steps the offloaded parameters of ``batch`` and the in-memory ones of ``memory``
    (their gradients scaled by ``coef`` first, as clip_grad_norm_)."""
    attached = []
    for p, h in memory:
        if coef is not None:
            p.grad.detach().mul_(coef)
        opt._staging.attach(opt._opt, p, h)
    for p, h in batch:
        s = p._strata_slot
        g = p._strata_owner._read_grad(s).reshape(-1)
        if coef is not None:
            g.mul_(coef)
        copy = torch.empty(s.state_numel, dtype=s.dtype)
        opt._staging.forget_grad(h)
        opt._opt.set_grad(h, g)
        opt._opt.set_param_copy(h, copy)
        attached.append((p, h, g, copy))
    try:
        st = opt._opt.step(max_grad_norm=0.0)
    finally:
        for p, h, _, _ in attached:
            opt._opt.set_grad(h, None)
            opt._opt.set_param_copy(h, None)
        for p, h in memory:
            opt._staging.detach(opt._opt, h)
    for k in _SUMMED:
        stats[k] += st[k]
    for p, h, _, copy in attached:
        p._strata_owner.write(p, copy)
        opt._table.mark(h)
