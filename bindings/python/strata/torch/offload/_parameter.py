"""The offloaded parameter object: :class:`OffloadedParameter` (a ``torch.nn.Parameter``
whose data lives in a strata store), how torch operations on it materialize it, and what
autograd saves of it (a reference fetched again in backward: ``pack``/``unpack``).

The one attribute this wing sets on a parameter object is ``_strata_record`` (its
ParamRecord, whose ``owner`` is the ParameterOffload); :func:`record_of` reads it. Nothing
outside ``strata.torch.offload`` reads or sets attributes on parameter objects: the
optimizer wing asks :func:`is_offloaded` / :func:`offload_of` and the ParameterOffload's
public methods.

Thread-safety: one thread at a time (torch's forward/backward thread).
"""

from __future__ import annotations

import weakref
from typing import Any, List, Optional, Tuple

import torch

from .. import _saved
from .._common import no_torch_function as _no_tf
from ._grad_tensor import has_grads, unwrap_grads
from ._record import IN_MEMORY, ParamRecord
from ._tiled import NOT_TILED, TILED_NAMES, tiled_call

#: properties read or set without the parameter's data
_META_GET = frozenset({
    "shape", "grad", "requires_grad", "dtype", "device", "_version", "is_leaf", "grad_fn",
    "is_cuda", "is_sparse", "layout", "ndim", "names", "is_quantized", "is_meta", "is_mkldnn",
    "_base", "output_nr", "_backward_hooks", "name", "_grad", "_grad_fn", "is_nested",
    "_cdata", "_python_dispatch", "is_xpu", "is_ipu", "is_mps", "is_vulkan", "is_ort"})
_META_SET = frozenset({"grad", "requires_grad", "_backward_hooks", "name", "_grad"})
#: methods that need no data
_META_FN = frozenset({
    "size", "dim", "numel", "requires_grad_", "__hash__", "is_floating_point",
    "element_size", "get_device", "nelement", "ndimension", "register_hook",
    "retain_grad", "is_complex", "_is_view", "__len__", "_register_access_hook"})


class OffloadedParameter(torch.nn.Parameter):
    """A parameter whose data lives in a strata store (see strata.torch.offload_parameters).
    Instances are made by :func:`offload_parameters` only (it changes the class of the
    model's own parameter objects, so references held elsewhere stay valid)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            prop = func.__self__.__name__
            if prop == "grad" and type(args[0]) is OffloadedParameter:
                s = args[0]._strata_record
                if s.to_store:  # a strata optimizer's: the stored gradient
                    return s.owner.grads.get(s)
            if prop in _META_GET:
                with _no_tf():
                    return func(*args, **kwargs)
        elif name == "__set__":
            prop = func.__self__.__name__
            if prop == "grad" and type(args[0]) is OffloadedParameter:
                s = args[0]._strata_record
                if s.to_store:
                    return s.owner.grads.assign(s, args[1])
            if prop in _META_SET:
                with _no_tf():
                    return func(*args, **kwargs)
            if prop == "data":
                return _set_data(args[0], args[1])
        elif name == "__delete__":  # del p.grad: as p.grad = None (torch's own rule)
            prop = func.__self__.__name__
            if prop == "grad" and type(args[0]) is OffloadedParameter:
                s = args[0]._strata_record
                if s.to_store:
                    return s.owner.grads.assign(s, None)
            if prop in _META_SET:
                with _no_tf():
                    return func(*args, **kwargs)
        elif name in _META_FN:
            with _no_tf():
                return func(*args, **kwargs)
        if name in TILED_NAMES:  # over a tiled parameter: block by block
            out = tiled_call(func, args, kwargs)
            if out is not NOT_TILED:
                return out
        if has_grads(args) or has_grads(kwargs.values()):  # e.g. p.add_(p.grad, alpha=-lr)
            args, kwargs = unwrap_grads(args, kwargs)
        records: List[ParamRecord] = []
        _gather(args, records)
        if kwargs:
            _gather(kwargs.values(), records)
        if not records:
            with _no_tf():
                return func(*args, **kwargs)
        owner = records[0].owner
        if any(r.owner is not owner for r in records):
            for o in {id(r.owner): r.owner for r in records}.values():
                o.ws.materialize_together([r for r in records if r.owner is o])
        else:
            owner.ws.materialize_together(records)
        if not torch.is_grad_enabled():
            with _no_tf():
                return func(*args, **kwargs)
        # what autograd saves of the parameters is a reference, fetched again in backward
        with _no_tf(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return func(*args, **kwargs)

    # copies, pickles and reprs: offload/_copy.py
    def __deepcopy__(self, memo: dict) -> torch.nn.Parameter:
        from ._copy import deepcopy_parameter
        return deepcopy_parameter(self, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        from ._copy import reduce_parameter
        return reduce_parameter(self, protocol)

    def __repr__(self, *args: Any, **kwargs: Any) -> str:
        from ._copy import repr_parameter
        return repr_parameter(self)


def is_offloaded(p: Any) -> bool:
    """``p`` is a parameter offloaded by strata.torch.offload_parameters / offload_init
    (any ParameterOffload)."""
    return type(p) is OffloadedParameter


def record_of(p: Any) -> Optional[ParamRecord]:
    """The ParamRecord of offloaded parameter ``p`` (None for any other object)."""
    return p._strata_record if type(p) is OffloadedParameter else None


def offload_of(p: Any) -> Any:
    """The ParameterOffload holding offloaded parameter ``p`` (None for any other
    object)."""
    r = record_of(p)
    return None if r is None else r.owner


def note_checkpoint_value(p: torch.Tensor) -> None:
    """``p``'s value in memory is now a resumed optimizer checkpoint's master (a strata
    optimizer created with ``resume=True`` before the parameters are offloaded): a later
    ``offload_parameters(..., resume=True)`` stores this value as the parameter's instead of
    keeping the stored one, while ``p`` is not changed in memory meanwhile (its
    ``_version``), so the weights and the optimizer's moments are the same checkpoint's,
    whichever is created first."""
    _CHECKPOINT_VALUES[id(p)] = (weakref.ref(p), p._version)


def holds_checkpoint_value(p: torch.Tensor) -> bool:
    """:func:`note_checkpoint_value` was called on ``p`` and ``p`` is unchanged since."""
    entry = _CHECKPOINT_VALUES.get(id(p))
    if entry is None or entry[0]() is not p:
        return False
    with _no_tf():
        return p._version == entry[1]


#: id(parameter) -> (weak reference, its _version when noted): note_checkpoint_value
_CHECKPOINT_VALUES: dict = {}


def note_restored(p: torch.Tensor, version: int) -> None:
    """``p`` was just put back in memory by its offload's close() holding its stored value,
    whose change count (ParameterOffload.version) was ``version``: see :func:`restored_from`.
    The entry goes when ``p`` is garbage collected."""
    key = id(p)
    with _no_tf():
        _RESTORED[key] = (weakref.ref(p, lambda _r: _RESTORED.pop(key, None)), version,
                          (p._version, p.data_ptr()))


def restored_from(p: Any) -> Optional[int]:
    """For an optimizer that held ``p`` while it was offloaded: when a ParameterOffload's
    close() put ``p`` back in memory (a plain parameter again) and ``p`` is unchanged in
    memory since (its ``_version`` and ``data_ptr()``: no in-place edit, ``p.data = t``,
    ``load_state_dict``), the offload's version count of the value it restored
    (ParameterOffload.version at the close; counts are unique to each offloaded parameter,
    offload/_record.py) -- equal to the optimizer's mark of that value when the optimizer
    wrote or read it last, so its fp32 master (of which the value is the rounding) stays
    the master. Else None (also for an offloaded parameter and any other object).
    Thread-safety: as the offload (one thread at a time)."""
    entry = _RESTORED.get(id(p))
    if entry is None or entry[0]() is not p or type(p) is OffloadedParameter:
        return None
    with _no_tf():
        return entry[1] if (p._version, p.data_ptr()) == entry[2] else None


#: id(parameter) -> (weak reference, the version restored, (_version, data_ptr) after the
#: restore): note_restored
_RESTORED: dict = {}


def make_offloaded(p: torch.nn.Parameter, record: ParamRecord) -> None:
    """``p`` becomes an OffloadedParameter of ``record`` (the same object, released: its
    data is the record's placeholder)."""
    with _no_tf():
        p.data = record.placeholder
    p.__class__ = OffloadedParameter
    p._strata_record = record


def make_plain(p: OffloadedParameter, value: torch.Tensor) -> None:
    """``p`` becomes a plain ``torch.nn.Parameter`` again (the same object) holding
    ``value``."""
    with _no_tf():
        p.data = value
    p.__class__ = torch.nn.Parameter
    del p._strata_record


def _gather(values: Any, out: List[ParamRecord]) -> None:
    for v in values:
        if type(v) is OffloadedParameter:
            out.append(v._strata_record)
        elif isinstance(v, (list, tuple)):
            for w in v:
                if type(w) is OffloadedParameter:
                    out.append(w._strata_record)


def _set_data(p: OffloadedParameter, value: torch.Tensor) -> None:
    """``p.data = value`` on an offloaded parameter: ``value`` is its new data (stored when
    released). Its shape, dtype and device must stay the parameter's."""
    s = p._strata_record
    if tuple(value.shape) != s.shape or value.dtype != s.dtype or value.device != s.device:
        raise ValueError(
            f"offloaded parameter {s.name!r}: p.data = t needs t of the parameter's shape "
            f"{list(s.shape)}, dtype {s.dtype} and device {s.device} (got "
            f"{list(value.shape)}, {value.dtype}, {value.device}); assign a new Parameter "
            "to the module instead")
    s.owner.ws.adopt(s, value)


class _Packed:
    """What autograd saves for an offloaded parameter (or a view of one): the record and
    the view's geometry (size, stride, offset from the data's first element)."""

    __slots__ = ("record", "geometry")

    def __init__(self, record: ParamRecord, geometry: Optional[Tuple[Any, Any, int]]):
        self.record = record
        self.geometry = geometry


def pack(t: torch.Tensor) -> Any:
    """autograd's pack hook around operations on offloaded parameters: a saved parameter
    (or a view of one) is saved as a reference; other tensors as an active activation
    offload packs them (strata.torch._saved), else as they are."""
    if type(t) is OffloadedParameter:
        return _Packed(t._strata_record, None)
    base = t._base
    if base is not None and type(base) is OffloadedParameter:
        s = base._strata_record
        if s.state in IN_MEMORY:
            off = t.storage_offset() - s.resident.storage_offset()
            return _Packed(s, (t.size(), t.stride(), off))
    return _saved.pack_outer(t)


def unpack(x: Any) -> torch.Tensor:
    """autograd's unpack hook: a reference is materialized again (the backward phase of
    its offload)."""
    if type(x) is not _Packed:
        return _saved.unpack_any(x)
    owner = x.record.owner  # (another offload's parameter in the same op)
    owner.begin_backward()
    data = owner.ws.materialize(x.record)
    if x.geometry is None:
        return data
    size, stride, off = x.geometry
    return data.as_strided(size, stride, data.storage_offset() + off)


def present_plain(p: OffloadedParameter) -> None:
    """``p`` (materialized, and pinned by the caller) shows itself as a plain
    ``torch.nn.Parameter`` until :func:`present_offloaded`: torch's fused fast paths, which
    skip any argument with ``__torch_function__``, see an ordinary parameter. The record
    stays attached; in-place edits meanwhile move ``p._version`` as ever."""
    p.__class__ = torch.nn.Parameter


def present_offloaded(p: torch.nn.Parameter) -> None:
    """Undoes :func:`present_plain`."""
    p.__class__ = OffloadedParameter
