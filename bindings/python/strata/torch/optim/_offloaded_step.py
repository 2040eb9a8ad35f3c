"""The step of OffloadAdam/OffloadAdamW over offloaded parameters
(strata.torch.offload_parameters): gradients from the store, updated weights into the
parameters' store objects, in batches bounded by the working set.

The gate is strata's C++ ``decide_gate``, called once for the whole step with the summary
of optim/_gate.py (torch's norm of every gradient, in the model's parameter order, taken
when each reached the store; all-reduced over ranks): a step whose gradients hold an inf or
NaN is skipped (nothing changes, ``last_step["skipped"]``), and clipping
(``max_grad_norm``) uses ``torch.nn.utils.clip_grad_norm_``'s coefficient, which every batch
then applies as its ``grad_scale`` (no batch scans or rescales gradients again). Results are
bit-identical to ``clip_grad_norm_`` then torch.optim's step for fp32 gradients.

Batches. Parameters are stepped in batches whose gradient and weight buffers together
take at most the working set's bytes (a parameter larger than that alone): each batch's
gradients are read from the store, attached to strata's optimizer, stepped (its masters and
moments stream through strata's pipeline as in any step; each tensor keeps its own step
count, so batching changes no value), and the updated weights (the kernel's rounding to
the parameter's dtype) are stored as the parameters' new values. The parameters' working
set is released first (the step changes every value).

The offload wing is reached only through its public seam (``is_offloaded``, ``offload_of``
and ParameterOffload's methods).

Thread-safety: the optimizer's (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

import strata

from ... import _strata as _core
from .._common import all_finite
from .._trace import TRACE, traced
from ..offload import is_offloaded, offload_of
from ._exchange import TensorExchange, blocks_from_master
from ._gate import summarize
from ._param_table import ParamTable, offloads

_SUMMED = ("bytes_read", "bytes_written", "tensors_updated", "numel_updated", "seconds",
           "compute_seconds", "io_wait_seconds")


def _model_order(entry: Tuple[torch.Tensor, int]) -> Tuple[int, int, int]:
    """Offloaded parameters in their model's order (``model.parameters()``, as
    ``clip_grad_norm_(model.parameters())`` stacks their norms), then the others in the
    optimizer's."""
    p, h = entry
    o = offload_of(p)
    if o is not None:
        return (0, id(o), o.position(p))
    return (1, 0, h)


def _norm(p: torch.Tensor, grad: Any) -> torch.Tensor:
    """torch.norm(grad, 2) of ``p`` (in memory: of ``grad``, the step's): kept by the offload when it took the gradient, else
    computed (an offloaded parameter's from the store)."""
    o = offload_of(p)
    if o is None:
        return torch.norm(grad.detach(), 2.0)
    n = o.grad_info(p).norm
    return n if n is not None else torch.norm(o.read_grad(p), 2.0)


def _gate(table: ParamTable, max_grad_norm: float, grad_scale: float = 1.0
          ) -> Tuple[List[Tuple[torch.Tensor, int]], Dict[str, Any], Dict[str, Any]]:
    """The parameters with a gradient (param, handle) and the gate of the step over them
    (strata's ``decide_gate`` on the summary of optim/_gate.py), and the step statistics
    started with its ``skipped``, ``grad_norm``, ``clip_coef``."""
    holders = offloads(table.params)
    fp32_sums = table.accum.mode == "float32"  # (grad_accumulation_dtype)
    for p in table.params:  # (those offloaded after the optimizer took them were bound by
        if is_offloaded(p):  # the offload: GradAccumulation.param_offloaded; idempotent)
            offload_of(p).bind_optimizer(p, fp32_sums)
    for o in holders:
        o.collect_grads()
    entries: List[Tuple[torch.Tensor, int]] = []  # (param, handle) with a gradient
    finite = True
    for p in table.params:
        h = table.handle[id(p)]
        if is_offloaded(p):
            info = offload_of(p).grad_info(p)
            if info.has_grad:
                entries.append((p, h))
                finite &= info.finite
        elif table.accum.grad(p) is not None:  # p.grad, or its fp32 sum (_grad_accum.py)
            entries.append((p, h))
            finite &= all_finite(table.accum.grad(p))
    comm = next((o.comm for o in holders if o.comm is not None), None)
    if comm is not None and any(not is_offloaded(p) for p, _ in entries):
        raise ValueError("an optimizer over parameters offloaded with a communicator (ZeRO-3) "
                         "must hold only such parameters: the gradients of the others are "
                         "not reduced over the ranks")
    clip = max_grad_norm > 0 and (bool(entries) or comm is not None)
    norms = ([_norm(p, table.accum.grad(p)) for p, _ in sorted(entries, key=_model_order)]
             if clip else [])
    grad_norm, nonfinite, arithmetic = summarize(norms, finite, comm, need_norm=clip)
    gate = _core.decide_gate(max_grad_norm if clip else 0.0, grad_scale, True, grad_norm,
                             nonfinite, arithmetic)
    stats: Dict[str, Any] = dict(skipped=gate["skipped"], grad_norm=gate["grad_norm"],
                                 clip_coef=gate["clip_coef"])
    for k in _SUMMED:
        stats[k] = 0
    stats.update(tensors_started_early=0, rolled_back=False, early_seconds=0.0)
    return entries, gate, stats


def offloaded_step(table: ParamTable, exchange: TensorExchange, max_grad_norm: float,
                   why: str = "", grad_scale: float = 1.0
                   ) -> Tuple[Dict[str, Any], List[Tuple[torch.Tensor, int]]]:
    """One step of the optimizer whose ParamTable ``table`` holds offloaded parameters (its
    param_groups, hyperparameters and optimizer.state already synced by step()).
    ``grad_scale``: every gradient's factor (1/loss scale), also the norm's (the gate).

    :returns: strata's step statistics summed over the batches (``skipped``, ``grad_norm``
        and ``clip_coef`` from the gate, as the ordinary step reports them), and the
        in-memory parameters stepped (for the caller's copy-back, as in the ordinary step).
    :raises ValueError: a communicator's (ZeRO-3) parameters mixed with in-memory ones.
    :raises RuntimeError: a gradient an update in backward took without storing it
        (optim/_overlap.py) is needed (naming the parameter and ``why``: what rolled those
        updates back), raised before anything is stepped.
    :raises strata.Error: the store's errors; parameters stepped in earlier batches keep
        their new values (as a failed ordinary step, resume from the last checkpoint).
    """
    entries, gate, stats = _gate(table, max_grad_norm, grad_scale)
    if gate["skipped"]:
        return stats, []
    for p, _ in entries:  # before anything is stepped
        if is_offloaded(p) and not offload_of(p).grad_stored(p):
            raise RuntimeError(
                f"step(): offloaded parameter {offload_of(p).name_of(p)!r} must be stepped after backward"
                f"{' because ' + why if why else ''}, but its gradient was taken by the "
                "update in backward (overlap_backward=True) and not stored; nothing was "
                "stepped (the early updates were rolled back). Pass max_grad_norm= to the "
                "optimizer to keep gradients for such a redo (4 bytes per parameter "
                "written), or use overlap_backward=False")
    _run_batches(table, exchange, entries, gate["grad_scale"], stats)
    return stats, [(p, h) for p, h in entries if not is_offloaded(p)]


def finish_offloaded(table: ParamTable, exchange: TensorExchange, overlap: Any,
                     max_grad_norm: float
                     ) -> Tuple[Dict[str, Any], List[Tuple[torch.Tensor, int]]]:
    """The step of an optimizer over offloaded parameters whose updates started in backward
    (``overlap``: its open BackwardOverlap, optim/_overlap.py). The gate is computed here as
    in :func:`offloaded_step`; a step that is skipped rolls the early updates back (nothing
    changes); one that is clipped, or whose taken gradients were edited since, rolls them
    back and runs :func:`offloaded_step` (from the stored gradients). Otherwise the early
    updates are committed (strata's finish_step, which also steps the in-memory parameters
    not started), then the offloaded parameters with a gradient that no early update took
    (accumulated under ``accumulating()``, say) are stepped in batches. Same results as
    :func:`offloaded_step`, bit for bit; same returns and errors."""
    entries, gate, stats = _gate(table, max_grad_norm)
    if gate["skipped"]:
        overlap.abort()
        return stats, []
    if gate["grad_scale"] != 1.0 or overlap.broken:
        overlap.abort("the step clips (max_grad_norm)" if gate["grad_scale"] != 1.0 else
                      "p.grad of a parameter was changed after backward")
        return _redo(table, exchange, max_grad_norm, overlap.abort_reason)
    started_off = overlap.started_offloaded()
    started = {id(p): staged for p, staged in started_off}
    core = table.core
    memory = [(p, h) for p, h in entries if not is_offloaded(p) and not overlap.is_started(p)]
    rest = [(p, h) for p, h in entries if is_offloaded(p) and id(p) not in started]
    for p in table.params:  # what earlier in-memory steps attached to offloaded parameters
        if is_offloaded(p) and id(p) not in started:  # (the started ones: their early grads)
            exchange.detach(core, table.handle[id(p)])
    for p, h in memory:
        exchange.attach(core, p, h)
    try:
        st = overlap.finish(0.0, None)
    except BaseException as e:
        for p, staged in started_off:  # rolled back: the staged values are not the step's
            if staged is not None:
                offload_of(p).unstage(p, staged)
        if isinstance(e, strata.FailedPreconditionError):
            # strata had to redo (hyperparameters changed since backward) and rolled back
            return _redo(table, exchange, max_grad_norm,
                         "hyperparameters were changed between backward and step()")
        raise
    finally:
        for p, h in memory:
            exchange.detach(core, h)
    if TRACE.on: TRACE.pipeline(st)  # noqa: E701
    for k in _SUMMED:
        stats[k] += st[k]
    for k in ("tensors_started_early", "early_seconds", "exposed_seconds",
              "overlapped_seconds"):
        stats[k] = st[k]
    for p, h in entries:
        if id(p) in started:
            offload_of(p).committed(p, started[id(p)])
            table.mark(h)
    if rest:
        _run_batches(table, exchange, rest, 1.0, stats)
    return stats, memory


def _redo(table: ParamTable, exchange: TensorExchange, max_grad_norm: float, why: str
          ) -> Tuple[Dict[str, Any], List[Tuple[torch.Tensor, int]]]:
    """:func:`offloaded_step` after the early updates were rolled back (``why``)."""
    stats, stepped = offloaded_step(table, exchange, max_grad_norm, why)
    stats["rolled_back"] = True
    return stats, stepped


def _run_batches(table: ParamTable, exchange: TensorExchange,
                 entries: List[Tuple[torch.Tensor, int]], grad_scale: float,
                 stats: Dict[str, Any]) -> None:
    """Steps ``entries`` in batches bounded by the working set (see the module doc), every
    gradient scaled by ``grad_scale``."""
    holders = offloads(table.params)
    for o in holders:
        o.release_all()
    for p in table.params:  # what earlier in-memory steps attached (a parameter offloaded
        if is_offloaded(p):  # since): no batch may step it but its own
            exchange.detach(table.core, table.handle[id(p)])
    budget = min(o.working_set_bytes for o in holders)
    memory: List[Tuple[torch.Tensor, int]] = []
    batch: List[Tuple[torch.Tensor, int]] = []
    used = 0
    for p, h in entries:
        if not is_offloaded(p):
            memory.append((p, h))
            continue
        o = offload_of(p)  # (a tiled parameter's gradient and value stay in the store)
        need = 0 if _streamed(table.core, o, p, h) else o.state_numel(p) * 4 * 2
        if batch and used + need > budget:
            _run_batch(table, exchange, batch, memory, grad_scale, stats)
            memory, batch, used = [], [], 0
        batch.append((p, h))
        used += need
    if batch or memory:
        _run_batch(table, exchange, batch, memory, grad_scale, stats)


def _streamed(core: Any, o: Any, p: torch.Tensor, h: int) -> bool:
    """``p`` is tiled, its gradient object is in the optimizer's store (set_grad_object
    reads it there) and its master is an NVMe-tier tensor (a host-tier master is in memory
    whole anyway); otherwise a tiled parameter is stepped whole, as any other."""
    return (o.tiled(p) and o.store is core.store
            and core.param_info(h)["placement"] == "nvme")


@traced("step.batch", "optimizer")
def _run_batch(table: ParamTable, exchange: TensorExchange,
               batch: List[Tuple[torch.Tensor, int]], memory: List[Tuple[torch.Tensor, int]],
               grad_scale: float, stats: Dict[str, Any]) -> None:
    """Steps the offloaded parameters of ``batch`` and the in-memory ones of ``memory``,
    every gradient scaled by the gate's ``grad_scale`` inside strata's kernels (no
    rescan: ``skip_if_nonfinite=False``, the gate decided already)."""
    core = table.core
    attached = []
    for p, h in memory:
        exchange.attach(core, p, h, table.accum.grad(p))
    for p, h in batch:
        o = offload_of(p)
        if _streamed(core, o, p, h):  # the gradient streamed from its object; value stored after
            key, dtype = o.grad_object(p)
            exchange.forget(h)
            core.set_grad_object(h, key, dtype)
            core.set_param_copy(h, None)
            attached.append((p, h, None, None))
            continue
        g = o.read_grad(p)
        # a linked parameter's value is the master the step writes: no copy of it
        copy = None if o.linked(p) else torch.empty(o.state_numel(p), dtype=p.dtype)
        exchange.forget(h)
        core.set_grad(h, g)
        core.set_param_copy(h, copy)
        attached.append((p, h, g, copy))
    try:
        st = core.step(max_grad_norm=0.0, grad_scale=grad_scale, skip_if_nonfinite=False)
        if TRACE.on: TRACE.pipeline(st)  # noqa: E701
    finally:
        for p, h, _, _ in attached:
            core.set_grad(h, None)
            core.set_param_copy(h, None)
        for p, h in memory:
            exchange.detach(core, h)
    for k in _SUMMED:
        stats[k] += st[k]
    for p, h, g, copy in attached:
        if g is None:  # tiled: its new value from the master, block by block
            blocks_from_master(core, h, p)
        elif copy is None:
            offload_of(p).committed(p)
        else:
            offload_of(p).write(p, copy)
        table.mark(h)
