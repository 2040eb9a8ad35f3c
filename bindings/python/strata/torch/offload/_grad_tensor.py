"""``p.grad`` of an offloaded parameter whose gradients a strata optimizer keeps in the store:
an :class:`OffloadedGrad`, a tensor that stands for the stored gradient and behaves as
torch's ``p.grad`` for whatever code runs between backward and step.

What each operation costs (docs/offload.md, "Gradients between backward and step"):

* metadata (``shape``, ``dtype``, ``device``, ``size()``, ``grad_fn``, ...), ``detach()``,
  ``detach_()``, ``.data``, ``requires_grad_(False)``: nothing (``detach()`` and ``.data``
  return the gradient itself: in-place operations through them change ``p.grad``, as in
  torch).
* ``torch.norm(g)`` / ``g.norm()`` / ``torch.linalg.vector_norm(g)`` / ``torch._foreach_norm``
  with the L2 norm over every element: the norm the gradient store computed when torch had
  accumulated the gradient (the same function on the same values: bit-identical), no I/O.
  So ``torch.nn.utils.clip_grad_norm_`` reads nothing.
* ``g.mul_(c)`` / ``g.div_(c)`` with a Python number or a 0-d tensor (``clip_grad_norm_``'s
  rescale, loss-scale division): recorded, no I/O; replayed as the same torch operation on
  the gradient when it is next read (by the step, or by another operation). A factor of
  exactly 1.0 changes no bit and is dropped.
* ``g.zero_()`` (``zero_grad(set_to_none=False)``): the gradient is zeros, no I/O.
* anything else (``clamp_``, ``add_``, indexing, reads such as ``g.clone()`` or ``g.sum()``,
  ``torch._foreach_*`` and AMP's unscale, which run per gradient): the gradient is
  materialized -- read from the store, recorded operations applied -- and the operation runs
  on it. Materialized gradients stay in memory (an edit through them, or through a view of
  them, is kept) up to half the working set; beyond it the oldest is stored back (written
  when changed) and released. The step takes a materialized gradient from memory.

Thread-safety: the training thread (as ParameterOffload).
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional, Tuple

import torch

from .._common import no_torch_function as _no_tf

#: properties read without the gradient's values
_META_GET = frozenset({
    "shape", "requires_grad", "dtype", "device", "_version", "is_leaf", "grad_fn", "is_cuda",
    "is_sparse", "layout", "ndim", "names", "is_quantized", "is_meta", "is_mkldnn", "_base",
    "output_nr", "_backward_hooks", "name", "grad", "_grad", "_grad_fn", "is_nested", "_cdata",
    "_python_dispatch", "is_xpu", "is_ipu", "is_mps", "is_vulkan", "is_ort"})
#: methods that need no values
_META_FN = frozenset({
    "size", "dim", "numel", "__hash__", "is_floating_point", "element_size", "get_device",
    "nelement", "ndimension", "is_complex", "_is_view", "__len__", "is_pinned"})
#: methods answered for the materialized gradient's layout (contiguous), no values read
_LAYOUT_FN = frozenset({"is_contiguous", "stride", "storage_offset"})
#: methods returning the gradient itself (no values read)
_SELF_FN = frozenset({"detach", "detach_"})
#: in-place scalings recorded instead of run
_SCALE_FN = frozenset({"mul_", "div_", "__imul__", "__itruediv__"})
_NORMS = frozenset({"norm", "vector_norm"})


class OffloadedGrad(torch.Tensor):
    """``p.grad`` of an offloaded parameter (see the module doc); made by the gradient
    store only. Its own data is the parameter's placeholder (one element expanded to the
    shape): shape, dtype and device are true without a read."""

    _grad_record: Any  # the ParamRecord of the parameter

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            prop = func.__self__.__name__
            if prop in _META_GET:
                with _no_tf():
                    return func(*args, **kwargs)
            if prop == "data" and type(args[0]) is OffloadedGrad:
                return args[0]
        elif name == "__set__":
            prop = func.__self__.__name__
            if prop == "data" and type(args[0]) is OffloadedGrad:
                g = args[0]
                g._grad_record.owner.grads.assign_value(g._grad_record, args[1])
                return None
            if prop in ("requires_grad", "name"):
                with _no_tf():
                    return func(*args, **kwargs)
        elif name in _META_FN:
            with _no_tf():
                return func(*args, **kwargs)
        elif name in _LAYOUT_FN and type(args[0]) is OffloadedGrad:
            r = args[0]._grad_record
            with _no_tf():
                like = torch.empty(r.shape if r.owned is None else (r.state_numel,),
                                   dtype=r.dtype, device="meta")
            return func(like, *args[1:], **kwargs)
        elif name in _SELF_FN and type(args[0]) is OffloadedGrad:
            return args[0]
        elif name == "requires_grad_" and type(args[0]) is OffloadedGrad:
            req = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
            if req:
                raise RuntimeError(f"offloaded parameter {args[0]._grad_record.name!r}: its "
                                   "stored gradient cannot require grad (create_graph "
                                   "backward is not supported for offloaded gradients)")
            return args[0]
        elif name == "zero_" and type(args[0]) is OffloadedGrad:
            g = args[0]
            g._grad_record.owner.grads.zero_one(g._grad_record)
            return g
        elif name in _SCALE_FN and type(args[0]) is OffloadedGrad and len(args) == 2 \
                and not kwargs and _is_scalar(args[1]):
            g = args[0]
            op = "div_" if name in ("div_", "__itruediv__") else "mul_"
            if g._grad_record.owner.grads.scale(g._grad_record, op, args[1]):
                return g
        elif name in _NORMS and args and type(args[0]) is OffloadedGrad:
            n = _cached_norm(args[0], args[1:], kwargs)
            if n is not None:
                return n
        elif name.startswith("_foreach_") or name == "_amp_foreach_non_finite_check_and_unscale_":
            out = _per_tensor(func, args, kwargs)
            if out is not NotImplemented:
                return out
        return _run_materialized(func, args, kwargs)


def make_grad(record: Any) -> OffloadedGrad:
    """The OffloadedGrad of ``record``'s parameter (a new object; the gradient store keeps
    one per parameter)."""
    g = torch.Tensor._make_subclass(OffloadedGrad, record.placeholder, False)
    g._grad_record = record
    return g


def _is_scalar(c: Any) -> bool:
    if isinstance(c, bool):
        return False
    if isinstance(c, numbers.Real):
        return True
    return torch.is_tensor(c) and type(c) is not OffloadedGrad and c.dim() == 0 and \
        not c.requires_grad


def _cached_norm(g: OffloadedGrad, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                 ) -> Optional[torch.Tensor]:
    """The stored L2 norm for ``norm(g)`` / ``norm(g, 2)`` / ``vector_norm(g, 2)`` over every
    element (no dim, keepdim False, no dtype, no out); None for any other form."""
    p = args[0] if args else kwargs.get("p", kwargs.get("ord", 2))
    if p is None or p == "fro":
        p = 2
    if not isinstance(p, numbers.Real) or float(p) != 2.0:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dim is not None or keepdim or kwargs.get("dtype") is not None or \
            kwargs.get("out") is not None or len(args) > 3:
        return None
    return g._grad_record.owner.grads.known_norm(g._grad_record)


def _per_tensor(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """A ``torch._foreach_*`` operation (or AMP's unscale) over a list holding
    OffloadedGrads, run one tensor at a time (each a one-element list): foreach operations
    are elementwise over their lists, so this is the same result, and no more than one
    gradient needs to be in memory at once. A one-element list of an OffloadedGrad: the
    norm, scaling and zeroing forms as the tensor methods; NotImplemented otherwise (the
    operation then runs on the materialized gradient)."""
    if not args or not isinstance(args[0], (list, tuple)):
        return NotImplemented
    tensors = args[0]
    n = len(tensors)
    if not any(type(t) is OffloadedGrad for t in tensors):
        return NotImplemented
    name = func.__name__
    if n == 1:
        g = tensors[0]
        if type(g) is not OffloadedGrad:
            return NotImplemented
        grads = g._grad_record.owner.grads
        if name == "_foreach_norm":
            norm = _cached_norm(g, args[1:], kwargs)
            return NotImplemented if norm is None else [norm]
        if name == "_foreach_zero_" and len(args) == 1 and not kwargs:
            grads.zero_one(g._grad_record)
            return None
        if name in ("_foreach_mul_", "_foreach_div_") and len(args) == 2 and not kwargs:
            c = args[1][0] if isinstance(args[1], (list, tuple)) and len(args[1]) == 1 \
                else args[1]
            if _is_scalar(c) and grads.scale(g._grad_record, name[len("_foreach_"):], c):
                return None
        return NotImplemented
    outs: List[Any] = []
    for i in range(n):
        a = [[x[i]] if isinstance(x, (list, tuple)) and len(x) == n else x for x in args]
        r = func(*a, **kwargs)  # an OffloadedGrad's dispatches here again, one element
        if isinstance(r, (list, tuple)):
            outs.extend(r)
    return None if name.endswith("_") else outs


def _run_materialized(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """``func`` on the materialized values of every OffloadedGrad among its arguments;
    an in-place result that is one of them is returned as the OffloadedGrad."""
    mats: Dict[int, OffloadedGrad] = {}
    new_args, new_kwargs = unwrap_grads(args, kwargs, mats)
    from ._parameter import OffloadedParameter  # (import cycle: _parameter imports us)
    if _contains(new_args, OffloadedParameter) or _contains(new_kwargs.values(),
                                                            OffloadedParameter):
        out = func(*new_args, **new_kwargs)  # the parameter's own materialization
    else:
        with _no_tf():
            out = func(*new_args, **new_kwargs)
    return _rewrap(out, mats)


def unwrap_grads(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                 mats: Optional[Dict[int, OffloadedGrad]] = None
                 ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """``args``/``kwargs`` with every OffloadedGrad replaced by its materialized values
    (also for operations dispatched to OffloadedParameter that take a gradient, e.g. a
    hand-written SGD's ``p.add_(p.grad, alpha=-lr)``); ``mats``, when given, maps
    ``id(values)`` to the OffloadedGrad each stands for."""
    def sub(v: Any) -> Any:
        if type(v) is OffloadedGrad:
            m = v._grad_record.owner.grads.materialize(v._grad_record)
            if mats is not None:
                mats[id(m)] = v
            return m
        if isinstance(v, (list, tuple)) and any(type(w) is OffloadedGrad for w in v):
            return type(v)(sub(w) for w in v)
        return v
    return tuple(sub(a) for a in args), {k: sub(v) for k, v in kwargs.items()}


def has_grads(values: Any) -> bool:
    """An OffloadedGrad among ``values`` (or in a list/tuple among them)."""
    return _contains(values, OffloadedGrad)


def _contains(values: Any, cls: type) -> bool:
    for v in values:
        if type(v) is cls:
            return True
        if isinstance(v, (list, tuple)) and any(type(w) is cls for w in v):
            return True
    return False


def _rewrap(out: Any, mats: Dict[int, OffloadedGrad]) -> Any:
    if torch.is_tensor(out) and id(out) in mats:
        return mats[id(out)]
    if isinstance(out, (list, tuple)) and any(torch.is_tensor(o) and id(o) in mats for o in out):
        return type(out)(_rewrap(o, mats) for o in out)
    return out
