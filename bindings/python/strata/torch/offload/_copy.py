"""Copies, pickles and reprs of offloaded parameters (and so of offloaded models).

``copy.deepcopy(model)`` (an EMA or teacher copy, ``torch.optim.swa_utils.AveragedModel``)
gives a copy offloaded into the SAME store under its own keys,
``<key_prefix>#copy<N>/<parameter name>`` (N: the smallest number >= 1 whose prefix holds
no object yet), with its own ParameterOffload (its own working set of the same budget, its
own hooks, the source's tier and prefetch setting): :func:`copy_handle`, made once per
deepcopy (the deepcopy memo maps the source's handle to it, so tied parameters stay tied
and every copied hook drives the copy). Values are copied object by object, store to store
(one parameter in memory at a time; a materialized parameter's current value, edits
included). The copy's handle is ``strata.torch.offload_of(p)`` of any of its parameters;
close it (``close()``: its parameters come back in memory, then its store objects are
deleted; ``close(restore=False)``: its objects stay, resumable with
``offload_parameters(copy, store, key_prefix=<its key_prefix>, resume=True)``). It is also
closed when the store closes and at interpreter exit, like any ParameterOffload. Over
ranks (``comm``) deepcopy is refused.

Pickling (``torch.save(model)``, ``pickle.dumps(p)``): an offloaded parameter pickles as a
plain ``torch.nn.Parameter`` holding its current value (shape, dtype, device and layout
kept), so loading gives an ordinary model; it is refused (strata.ResourceExhaustedError)
when the offload's parameters together exceed the memory available to the process, since
the pickler holds every value until it writes them.

Thread-safety: one thread at a time, as ParameterOffload.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

import strata

from .._common import no_torch_function as _no_tf
from ._memory import available_memory
from ._parameter import make_offloaded, record_of
from ._record import IN_MEMORY, ParamRecord, shaped


def copy_handle(src: Any, memo: dict) -> Any:
    """The ParameterOffload that this deepcopy (``memo``) copies ``src``'s parameters into,
    made at its first call (see the module doc).

    :raises strata.FailedPreconditionError: ``src`` is closed.
    :raises strata.UnimplementedError: ``src`` is partitioned over ranks (``comm``)."""
    c = memo.get(id(src))
    if c is not None:
        return c
    src._check_open()
    if src.comm is not None:
        raise strata.UnimplementedError(
            "copy.deepcopy of a model offloaded over ranks (offload_parameters(comm=...)) is "
            "not supported: offload a copy made before the offload instead")
    n = 1
    while src.store.keys(f"{src.key_prefix}#copy{n}/"):
        n += 1
    c = type(src)(src.store, None, src.working_set_bytes, src.tier,
                  f"{src.key_prefix}#copy{n}/", src.ws.prefetch, tile_bytes=src.tile_bytes,
                  grad_host_budget=src.grad_host_budget,
                  release_memory=src.release_rule.mode)
    c.copy_of_prefix = src.key_prefix
    memo[id(src)] = c
    memo.setdefault(id(memo), []).append(src)  # (deepcopy's keep-alive list)
    return c


def deepcopy_parameter(p: Any, memo: dict) -> torch.nn.Parameter:
    """``copy.deepcopy`` of offloaded parameter ``p``: a new OffloadedParameter of the
    copy's handle (same shape, dtype, device, layout and requires_grad; no gradient, as
    torch's Parameter.__deepcopy__), its value stored under the copy's key."""
    s = record_of(p)
    c = copy_handle(s.owner, memo)
    key = f"{c.key_prefix}{s.name}"
    with _no_tf():
        q = torch.nn.Parameter(s.placeholder, requires_grad=p.requires_grad)
        value: Any = None
        if s.state in IN_MEMORY:  # its current value, edits included
            value = s.resident.detach().reshape(-1).cpu().contiguous()
            bf16 = None
        elif s.tile is not None:  # tiled: block by block
            s.owner.tiled_grads.copy_value(s, key)
        else:  # (one process: copy_handle refuses ranks)
            s.owner.ws.touch(s)  # (an update in backward not yet committed: rolled back)
            value = s.owner.store.get(s.value_key)
            bf16 = "bf16" if s.dtype == torch.bfloat16 else None
    if value is not None:
        c.store.put(key, value, tier=c.tier, overwrite=True, dtype=bf16)
    r = ParamRecord(len(c.ws.records), s.name, key, q, c)
    r.stride, r.tile = s.stride, s.tile
    c.ws.records.append(r)
    make_offloaded(q, r)
    return q


def plain_value(p: Any) -> torch.Tensor:
    """The current value of offloaded parameter ``p`` as a new plain tensor of its shape,
    dtype, device and layout (read from the store when released; the working set is not
    touched)."""
    s = record_of(p)
    flat = s.owner.read(p).reshape(-1)
    return shaped(s, flat.to(s.device))


def reduce_parameter(p: Any, protocol: Any) -> Any:
    """``p.__reduce_ex__``: a plain ``torch.nn.Parameter`` of its current value (torch's own
    ``_rebuild_parameter``; hooks are not pickled, as torch's Parameter).

    :raises strata.ResourceExhaustedError: the offload's parameters (all of them: the
        pickler keeps each value until it writes the file) exceed the memory available to
        the process (MemAvailable, or a memory cgroup's headroom)."""
    s = record_of(p)
    owner = s.owner
    total = sum(r.nbytes for r in owner.ws.records)
    avail = available_memory()
    if avail is not None and total > avail:
        raise strata.ResourceExhaustedError(
            f"pickling offloaded parameter {s.name!r} (torch.save(model), copy.copy, "
            f"pickle): the {len(owner.ws.records)} parameters of its offload take "
            f"{total} bytes, more than the {avail} bytes of memory available, and pickling "
            "holds every value at once (so does model.state_dict(), a dict of every value). "
            "Use ParameterOffload.checkpoint() and offload_parameters(model, store, "
            "resume=True) instead, or save one parameter at a time: handle.read(p) for "
            "each (name, p) of model.named_parameters()")
    with _no_tf():
        requires_grad = p.requires_grad
    return (torch._utils._rebuild_parameter,
            (plain_value(p), requires_grad, collections.OrderedDict()))


def repr_parameter(p: Any) -> str:
    """``repr(p)``: torch's text for a parameter of the same value (``Parameter
    containing:\\ntensor([...], requires_grad=True)``), read without disturbing the
    working set; a closed offload's parameter names its store key instead."""
    s = record_of(p)
    if s.owner.closed:
        return (f"Parameter containing:\n<offloaded parameter {s.name!r} (store key {s.key!r}) "
                f"of a closed ParameterOffload: shape {list(s.shape)}, {s.dtype}, {s.device}>")
    with _no_tf():
        requires_grad = p.requires_grad
    return repr(torch.nn.Parameter(plain_value(p), requires_grad=requires_grad))
