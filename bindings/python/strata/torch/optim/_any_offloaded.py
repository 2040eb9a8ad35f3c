"""OffloadOptimizer (optim/_any.py) over parameters offloaded by
``strata.torch.offload_parameters``: the same seam of the offload as OffloadAdam's step
(optim/_offloaded_step.py, optim/_registry.py) -- ``bind_optimizer`` (gradients go to the
offload's store, fp16/bf16 ones summed in fp32 with ``grad_accumulation_dtype=float32``),
``read_grad`` (the gradient the step takes), ``read_state`` / ``write`` (the value) -- so an
offloaded parameter steps exactly as the class in memory steps it:

* its fp32 master starts from its stored value (widened exactly), and takes the stored
  value again when it changed outside the optimizer (the offload's version count: edits
  written back, ``model.load_state_dict``); after the offload's close() it keeps its
  master while the restored parameter is unchanged in memory (:func:`keep_restored`);
* at a step, its gradient is read from the store, its updated master is rounded to the
  parameter's dtype by strata (as an in-memory parameter's copy) and stored as its value;
* parameters are stepped in batches whose gradients and new values take at most the
  working set's bytes (each tensor keeps its own step count: batching changes no value);
  the working set is released first (the step changes every value).

Offloaded parameters partitioned over ranks (``comm=``, ZeRO-3) are refused (the class's
state is shaped like the whole parameter). Only package-level names of strata.torch.offload.

Thread-safety: the optimizer's (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..offload import is_offloaded, offload_of
from ._exchange import as_f32_numpy, copy_master_to_param, master_from_blocks
from ._param_table import offloaded_unchanged, offloads, restored_unchanged, take_value


def check(p: torch.Tensor, i: int) -> None:
    """ValueError naming parameter ``i`` when offloaded ``p`` is partitioned over ranks."""
    o = offload_of(p)
    if o.state_numel(p) != p.numel():
        raise ValueError(f"OffloadOptimizer: parameter {i} ({o.name_of(p)!r}) is offloaded "
                         "with a communicator (ZeRO-3: this rank holds a slice of it); "
                         "OffloadOptimizer steps whole parameters: use OffloadAdam / "
                         "OffloadAdamW")


def check_params(params: List[torch.Tensor]) -> None:
    """OffloadOptimizer's parameters (in param_groups order): each listed once, a
    contiguous fp32/fp16/bf16 CPU tensor or a parameter offloaded in one process.

    :raises ValueError: naming the parameter's index (and the first listing of one listed
        twice; the offload's name of one partitioned over ranks)."""
    seen_ids: Dict[int, int] = {}
    for i, p in enumerate(params):
        if id(p) in seen_ids:
            raise ValueError(f"OffloadOptimizer: parameter {i} is parameter "
                             f"{seen_ids[id(p)]} again; torch.optim would step it twice "
                             "per step (deprecated): list each parameter once")
        seen_ids[id(p)] = i
    for i, p in enumerate(params):
        if is_offloaded(p):  # its value and gradient in the offload's store
            check(p, i)
        if (p.dtype not in (torch.float32,) + (torch.float16, torch.bfloat16) or p.device.type != "cpu"
                or not (p.is_contiguous() or is_offloaded(p))):
            raise ValueError(f"OffloadOptimizer: parameter {i} is {p.dtype} on "
                             f"{p.device}{'' if p.is_contiguous() else ', not contiguous'}"
                             "; it takes contiguous float32, float16 or bfloat16 CPU "
                             "parameters")


def signature(p: torch.Tensor) -> Tuple[Any, int]:
    """What tells a change of offloaded ``p``'s value: its offload's version count."""
    return ("offloaded", offload_of(p).version(p))


def bind(p: torch.Tensor, fp32_sums: bool) -> None:
    """``p``'s gradients go to its offload's store (fp16/bf16: summed in fp32 when
    ``fp32_sums``); idempotent."""
    offload_of(p).bind_optimizer(p, fp32_sums)


def add(core: Any, name: str, p: torch.Tensor) -> int:
    """A new strata tensor for offloaded ``p``, its master from the stored value."""
    o = offload_of(p)
    if o.tiled(p):  # block by block: never the whole value in memory
        h = core.add_param(name, p.numel(), None)
        master_from_blocks(core, h, p)
        return h
    return core.add_param(name, p.numel(), as_f32_numpy(o.read_state(p)))


def master_into(core: Any, h: int, p: torch.Tensor) -> None:
    """The master of handle ``h`` stored as offloaded ``p``'s value (rounded to its dtype)."""
    copy_master_to_param(core, h, p)


def take_changed(core: Any, params: List[Tuple[int, torch.Tensor]],
                 seen: Dict[int, Any]) -> None:
    """Of ``params`` ((handle, p), every parameter): edits of materialized offloaded ones
    written back, then each offloaded one whose value changed since ``seen[h]`` taken as its
    master -- except one offloaded after the optimizer took it in memory, unchanged since
    (``seen[h]`` its in-memory signature (data_ptr, version)) and whose stored value is that
    one: the master already holds it (a bf16 parameter's master keeps its precision). An
    in-memory one put back by its offload's close() (:func:`keep_restored`) keeps its master
    too; other in-memory ones are left to the caller."""
    for o in offloads([p for _, p in params]):
        o.write_back()
    for h, p in params:
        if not is_offloaded(p):
            keep_restored(core, h, p, seen)
            continue
        now = signature(p)
        if seen[h] == now:
            continue
        old = seen[h]  # in memory: (data_ptr, version)
        if old[0] == "offloaded" or not offloaded_unchanged((old[1], old[0]), p):
            take_value(core, h, p)
        seen[h] = now


def keep_restored(core: Any, h: int, p: torch.Tensor, seen: Dict[int, Any]) -> bool:
    """In-memory ``p`` (handle ``h``), last seen offloaded (``seen[h]`` its offload's
    version), put back in memory by the offload's close() with the value of that version and
    unchanged since (``restored_from``): that value is its master rounded to ``p``'s dtype,
    so the master stays (an fp16/bf16 parameter's fp32 master keeps its precision); strata's
    copy of the master goes to ``p``'s new memory and ``seen[h]`` becomes its in-memory
    signature (data_ptr, version). Returns whether so; else nothing changes (an edit after
    the close: the caller takes the value)."""
    if (not restored_unchanged(seen[h], p) or p.device.type != "cpu"
            or not p.is_contiguous()):
        return False
    core.set_param_copy(h, p.detach().view(-1))
    seen[h] = (p.data_ptr(), p._version)  # (OffloadOptimizer._signature of in-memory p)
    return True


def load_master(core: Any, h: int, p: torch.Tensor, master: Optional[torch.Tensor]) -> None:
    """load_state_dict's master of offloaded ``p``: ``master`` (its ``master_param``), else
    the stored value; an fp32 ``p``'s given master also becomes its value."""
    if master is None:
        take_value(core, h, p)
        return
    core.write_param(h, as_f32_numpy(master))
    if p.dtype == torch.float32:
        master_into(core, h, p)


def prepare(params: List[torch.Tensor], fp32_sums: bool) -> None:
    """Before a step: every offloaded parameter bound (idempotent: one offloaded after the
    optimizer took it was bound by the offload, optim/_grad_accum.py param_offloaded),
    gradients still in ``p.grad`` moved to the store, writes in flight waited for."""
    for p in params:
        if is_offloaded(p):
            bind(p, fp32_sums)
    for o in offloads(params):
        o.collect_grads()


def with_grad(entries: List[Tuple[int, torch.Tensor]], scaled: bool
              ) -> List[Tuple[int, torch.Tensor]]:
    """The offloaded ``entries`` (handle, p) with a gradient; under a loss scaler
    (``scaled``) those with an inf or NaN first (the first batch's step then skips: the
    whole step is skipped before any batch changed anything)."""
    out = [(h, p) for h, p in entries if offload_of(p).grad_info(p).has_grad]
    if scaled:
        out.sort(key=lambda e: bool(offload_of(e[1]).grad_info(e[1]).finite))
    return out


def batches(entries: List[Tuple[int, torch.Tensor]]) -> List[List[Tuple[int, torch.Tensor]]]:
    """``entries`` (handle, offloaded p) in batches whose fp32 gradients and new values
    take at most the smallest working set of their offloads (a larger one alone), after
    every offload's working set is released."""
    holders = offloads([p for _, p in entries])
    for o in holders:
        o.release_all()
    if not entries:
        return []
    budget = min(o.working_set_bytes for o in holders)
    out: List[List[Tuple[int, torch.Tensor]]] = [[]]
    used = 0
    for h, p in entries:
        need = p.numel() * (4 + p.element_size())
        if out[-1] and used + need > budget:
            out.append([])
            used = 0
        out[-1].append((h, p))
        used += need
    return out


def attach(core: Any, h: int, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Offloaded ``p``'s gradient (fp32, from the store) attached to handle ``h``, and a
    buffer of ``p``'s dtype for strata's copy of the updated master; returns both (kept
    alive until the step ends)."""
    g = offload_of(p).read_grad(p).to(torch.float32).contiguous().view(-1)
    copy = torch.empty(p.numel(), dtype=p.dtype)
    core.set_grad(h, g.numpy())
    core.set_param_copy(h, copy)
    return g, copy


def store_value(p: torch.Tensor, copy: torch.Tensor) -> None:
    """The step's new value of offloaded ``p`` (``copy``, its dtype) into its store."""
    if copy.numel():
        offload_of(p).write(p, copy)


#: strata's step statistics that add up over batches
_SUMMED = ("bytes_read", "bytes_written", "tensors_updated", "numel_updated", "seconds",
           "compute_seconds", "io_wait_seconds", "sub_groups")


def add_stats(total: Dict[str, Any], st: Dict[str, Any]) -> Dict[str, Any]:
    """``total`` with a later batch's statistics ``st`` added (its counts and times)."""
    out = dict(total)
    for k in _SUMMED:
        if k in st and k in out:
            out[k] = out[k] + st[k]
    return out
