"""What both wings of strata.torch need, once: the autograd hook on a parameter's gradient
accumulator, the one copy of a gradient to host memory, the finiteness test of a gradient,
the dtypes strata's kernels read, the route a resume at another world size is told, and
the optimizers told when a parameter they hold is offloaded (:func:`note_holder`,
:func:`announce_offload`).

Imported by ``strata.torch.optim`` (the offloaded optimizers) and ``strata.torch.offload``
(parameter offload); it imports neither.

Thread-safety: pure functions, except that ``watch_accumulation`` registers a hook that runs
on torch's autograd thread (the caller's, for CPU models), and the holders' registry
(:func:`note_holder`, :func:`announce_offload`): the training thread only.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

#: gradient (and parameter) dtypes strata's kernels read as they are; others are converted
#: to fp32 on the way in
GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: the end of the errors of a resume at another world size (offload/_args.py,
#: optim/_checkpoints.py)
UNIVERSAL_ROUTE = ("strata's own checkpoints resume only at the world size they were written "
                   "at; to change it, save with strata.torch.save_universal_checkpoint and "
                   "load with load_universal_checkpoint at the new size (docs/checkpoints.md, "
                   "'Optimizer state at another world size')")

#: a context manager turning off ``__torch_function__`` overrides (an offloaded parameter's)
no_torch_function = torch._C.DisableTorchFunction


def watch_accumulation(p: torch.Tensor, fn: Callable[[], None]) -> Any:
    """Calls ``fn()`` each time autograd has accumulated a gradient into ``p.grad``: a hook
    on ``p``'s AccumulateGrad node (``p.expand_as(p).grad_fn.next_functions[0][0]``; torch
    1.13 has no ``register_post_accumulate_grad_hook``).

    :param p: a leaf tensor with ``requires_grad`` (a parameter; an offloaded one too).
    :returns: the node, which the caller keeps alive (the hook lives as long as it does).
    :raises AttributeError: ``p`` does not require grad (it has no accumulator).
    """
    with torch.enable_grad(), no_torch_function():  # also under no_grad and inside hooks
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
    acc.register_hook(lambda grad_inputs, grad_outputs: fn())
    return acc


def host_grad(g: torch.Tensor, *, where: str = "", out: Optional[torch.Tensor] = None,
              keep_dtype: bool = False) -> torch.Tensor:
    """The one copy of a gradient to host memory: ``g`` as a flat, contiguous CPU tensor
    (a view of ``g`` itself where it already is one).

    :param g: the gradient (any shape and layout, CPU or CUDA).
    :param where: prefix of the error message naming the parameter, e.g.
        ``"offloaded parameter 'fc.weight': "``.
    :param out: for a CUDA gradient, the (pinned) host buffer to copy into, ``g.numel()``
        elements of the result's dtype; the copy is queued non-blocking (synchronize
        before reading it). None: a new buffer, copied synchronously (pinned when CUDA is
        available).
    :param keep_dtype: keep ``g``'s dtype; else one strata's kernels do not read
        (:data:`GRAD_DTYPES`) becomes fp32.
    :returns: a 1-d CPU tensor of ``g.numel()`` elements.
    :raises RuntimeError: a sparse gradient (naming ``where``).
    """
    if g.is_sparse:
        raise RuntimeError(f"{where}sparse gradients are not supported by strata's offloaded "
                           "optimizers and parameter offload")
    dtype = g.dtype if keep_dtype or g.dtype in GRAD_DTYPES else torch.float32
    if g.is_cuda:
        if out is None:
            out = torch.empty(g.numel(), dtype=dtype, pin_memory=True)
            out.copy_(g.reshape(-1))
        else:
            out.copy_(g.reshape(-1), non_blocking=True)
        return out
    flat = g.reshape(-1)
    if flat.dtype != dtype:
        flat = flat.to(dtype)
    return flat.contiguous()


def all_finite(t: torch.Tensor, norm: Optional[torch.Tensor] = None) -> bool:
    """``bool(torch.isfinite(t).all())`` for a floating tensor of any shape, dtype and
    layout, ~25x faster on CPU: torch 1.13's isfinite builds several full-size temporaries
    (measured: 2.5-5 s per iteration over the 139 M gradients of examples/train_offload.py's
    model on 2 cores). The L2 norm is finite only when every element is (a NaN or an
    infinity reaches it), so a finite norm answers True; a non-finite one (a non-finite
    element, or an overflow of large finite ones) takes the exact test.

    :param t: the tensor (CPU or CUDA; floating point).
    :param norm: ``torch.norm(t, 2.0)`` when the caller has it (clipping does), else it is
        computed here.
    :returns: True when every element of ``t`` is finite.
    """
    if norm is None:
        norm = torch.norm(t, 2.0)
    if bool(torch.isfinite(norm)):
        return True
    return bool(torch.isfinite(t).all())


#: id(parameter) -> (weak reference to it, weak references to its holders): the strata
#: optimizers told when parameter offload takes the parameter (:func:`announce_offload`)
_HOLDERS: Dict[int, Tuple["weakref.ReferenceType[torch.Tensor]",
                          List["weakref.ReferenceType[Any]"]]] = {}


def _forget_param(key: int, ref: "weakref.ReferenceType[torch.Tensor]") -> None:
    entry = _HOLDERS.get(key)
    if entry is not None and entry[0] is ref:
        del _HOLDERS[key]


def note_holder(p: torch.Tensor, holder: Any) -> None:
    """``holder`` -- the part of a strata optimizer that binds the parameters it holds to
    their offload (optim/_grad_accum.py's GradAccumulation), with a method
    ``param_offloaded(p)`` -- holds parameter ``p``: :func:`announce_offload` calls it when
    parameter offload takes ``p`` after the optimizer did, so the optimizer binds ``p`` then
    (its gradients go to the store, fp16/bf16 ones summed in fp32, from the first backward
    after the offload) and not at its next step. Both are referenced weakly (an entry
    goes with its parameter); idempotent; O(holders of ``p``).

    :param p: a parameter (any tensor that takes weak references).
    :param holder: the object to tell (kept only while something else keeps it alive).
    """
    key = id(p)
    entry = _HOLDERS.get(key)
    if entry is None or entry[0]() is not p:
        entry = (weakref.ref(p, lambda r, key=key: _forget_param(key, r)), [])
        _HOLDERS[key] = entry
    refs = entry[1]
    if any(r() is holder for r in refs):
        return
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(holder))


def announce_offload(p: torch.Tensor) -> None:
    """Parameter offload has just taken ``p`` (strata.torch.offload_parameters; ``p`` is
    offloaded, no gradient of it stored yet): each live holder noted by
    :func:`note_holder` gets ``holder.param_offloaded(p)``, in the order they were noted.
    Errors of a holder propagate."""
    entry = _HOLDERS.get(id(p))
    if entry is None or entry[0]() is not p:
        return
    for r in list(entry[1]):
        holder = r()
        if holder is not None:
            holder.param_offloaded(p)
