"""Parameter offload: a model's parameters (and, with strata's optimizers, its gradients)
live in a strata store and are materialized in a bounded working set while they are used
(``strata.torch.offload_parameters``; docs/offload.md, "Parameter offload").

How parameters are materialized. Each offloaded parameter becomes an
:class:`OffloadedParameter` (a ``torch.nn.Parameter`` subclass: ``isinstance`` checks,
``model.parameters()``, optimizers and ``requires_grad`` behave as before) whose data, when
released, is one element expanded to the parameter's shape: ``shape``, ``size()``,
``numel()`` and ``dim()`` stay true without a fetch. Every other torch operation that takes
the parameter -- a module's forward, a parameter used outside its own module (a tied output
head), ``p.add_()`` of torch.optim, ``model.load_state_dict`` -- materializes it first
(``__torch_function__``), so tied, shared and reused parameters need no registration.
Backward reads parameters through autograd's saved-tensor hooks (installed around every
operation on an offloaded parameter, inside the model's forward or not): a saved parameter
(or a view of one, as ``F.linear`` saves) is stored as a reference and fetched again when
backward needs it, so a released parameter is never read stale; other saved tensors are
untouched (a view made earlier keeps the buffer it views: fetches never reuse a buffer). In-place changes of a materialized parameter (``p.clamp_()`` under no_grad,
torch.optim's update) are seen by its version counter and written back to the store when
it is released.

Gradients. With strata's OffloadAdam/OffloadAdamW over the parameters, each gradient is
moved to the store as soon as torch has accumulated it (a hook on the parameter's
AccumulateGrad node): ``p.grad`` is None afterwards, backward never holds the whole
model's gradients, and micro-batches accumulate in the store exactly as torch's
``p.grad += g`` would. ``optimizer.zero_grad()`` and ``model.zero_grad()`` clear them;
:meth:`ParameterOffload.grad` reads one. With any other optimizer gradients stay in
``p.grad`` as torch leaves them (its update then materializes each parameter).

Thread-safety: one thread at a time (torch's forward/backward thread); the working set's
fetch thread is internal.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

import strata

from .._data_dir import make_temp_dir
from ._offload_grads import GradientsMixin
from ._working_set import Slot, WorkingSet, tensor_of

_no_tf = torch._C.DisableTorchFunction

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
    """A parameter whose data lives in a strata store (see the module doc). Instances are
    made by :func:`offload_parameters` only (it changes the class of the model's own
    parameter objects, so references held elsewhere stay valid)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            if func.__self__.__name__ in _META_GET:
                with _no_tf():
                    return func(*args, **kwargs)
        elif name == "__set__":
            prop = func.__self__.__name__
            if prop in _META_SET:
                with _no_tf():
                    return func(*args, **kwargs)
            if prop == "data":
                return _set_data(args[0], args[1])
        elif name in _META_FN:
            with _no_tf():
                return func(*args, **kwargs)
        slots: List[Slot] = []
        _gather(args, slots)
        if kwargs:
            _gather(kwargs.values(), slots)
        if not slots:
            with _no_tf():
                return func(*args, **kwargs)
        owner = slots[0].param._strata_owner
        if any(x.param._strata_owner is not owner for x in slots):
            for o in {id(x.param._strata_owner): x.param._strata_owner for x in slots}.values():
                o._materialize([x for x in slots if x.param._strata_owner is o])
        else:
            owner._materialize(slots)
        if not torch.is_grad_enabled():
            with _no_tf():
                return func(*args, **kwargs)
        # what autograd saves of the parameters is a reference, fetched again in backward
        with _no_tf(), torch.autograd.graph.saved_tensors_hooks(owner._pack, owner._unpack):
            return func(*args, **kwargs)


def _gather(values: Any, out: List[Slot]) -> None:
    for v in values:
        if type(v) is OffloadedParameter:
            out.append(v._strata_slot)
        elif isinstance(v, (list, tuple)):
            for w in v:
                if type(w) is OffloadedParameter:
                    out.append(w._strata_slot)


def _set_data(p: OffloadedParameter, value: torch.Tensor) -> None:
    """``p.data = value`` on an offloaded parameter: ``value`` is its new data (stored when
    released). Its shape, dtype and device must stay the parameter's."""
    s = p._strata_slot
    if tuple(value.shape) != s.shape or value.dtype != s.dtype or value.device != s.device:
        raise ValueError(
            f"offloaded parameter {s.name!r}: p.data = t needs t of the parameter's shape "
            f"{list(s.shape)}, dtype {s.dtype} and device {s.device} (got "
            f"{list(value.shape)}, {value.dtype}, {value.device}); assign a new Parameter "
            "to the module instead")
    p._strata_owner._adopt(s, value)


def _fix_mmap_threshold() -> None:
    """Fixes glibc's mmap threshold at its default (128 KiB; process-wide, once). glibc
    raises the threshold to the size of each large block freed (up to 32 MiB), after which
    blocks of that size come from the heap and freeing them no longer returns memory: the
    parameter and gradient buffers that come and go then grow the resident set far past
    the working set (measured: 880 MB instead of 480 MB peak on the main job's model).
    A no-op where glibc's mallopt is absent."""
    global _MMAP_FIXED
    if _MMAP_FIXED:
        return
    _MMAP_FIXED = True
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        M_MMAP_THRESHOLD = -3
        libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(128 * 1024))
    except (OSError, AttributeError):
        pass


_MMAP_FIXED = False


class _Packed:
    """What autograd saves for an offloaded parameter (or a view of one): the slot and the
    view's geometry (size, stride, offset from the data's first element)."""

    __slots__ = ("slot", "geometry")

    def __init__(self, slot: Slot, geometry: Optional[Tuple[Any, Any, int]]):
        self.slot = slot
        self.geometry = geometry


class ParameterOffload(GradientsMixin):
    """What :func:`offload_parameters` returns: the offloaded parameters of one model.

    Attributes: ``store`` (the strata.Store), ``working_set_bytes`` (the budget, bytes),
    ``tier``, ``key_prefix``. See :meth:`stats` for the counters.
    """

    def __init__(self, store: Optional[strata.Store], path: Optional[str],
                 working_set: Union[int, str], tier: str, key_prefix: str, prefetch: bool,
                 resume: bool = False, comm: Any = None, average_gradients: bool = True):
        self._closed = True
        self._owns_store = False
        self._owned_dir: Optional[str] = None
        self._model: Optional[torch.nn.Module] = None
        if tier not in ("nvme", "host"):
            raise ValueError(f"offload_parameters: tier must be 'nvme' or 'host', got {tier!r}")
        budget = strata.parse_size(working_set) if isinstance(working_set, str) else int(working_set)
        if budget <= 0:
            raise ValueError(f"offload_parameters: working_set must be > 0 bytes, got "
                             f"{working_set!r}")
        if store is None:
            if path is None:
                path = self._owned_dir = make_temp_dir("params-")
            store = strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                      chunk_size="4MiB", durability="flush", create=not resume)
            self._owns_store = True
        self.store = store
        self.tier = tier
        self.key_prefix = key_prefix
        self.working_set_bytes = budget
        _fix_mmap_threshold()
        self._stats: Dict[str, float] = {}
        self.reset_stats()
        #: strata.distributed.Communicator of a ZeRO-3 job (None: one process)
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.average_gradients = average_gradients
        self.ws = WorkingSet(store, budget, prefetch, self._stats, self.comm)
        self._grad_writes: Dict[int, Tuple[Any, torch.Tensor]] = {}  # slot -> (future, grad)
        self._grad_inflight = 0
        self._accumulators: List[Any] = []
        self._hook_handles: List[Any] = []
        self._clip = False
        self._init_count = 0  # parameters offloaded by offload_init, not yet attached
        self._closed = False
        strata._lifetime.register(self.store, self)

    # ---- setup ---------------------------------------------------------------------------

    def _offload(self, p: torch.nn.Parameter, name: str, key: str) -> Slot:
        """``p`` into the store as ``key`` (its current value) and released."""
        s = Slot(len(self.ws.slots), name, key, f"{key}#grad", p)
        with _no_tf():
            src = p.detach().reshape(-1).contiguous()
            if src.device.type != "cpu":
                src = src.cpu()
        if self.comm is None:
            self.store.put(key, src, tier=self.tier, overwrite=True)
        else:  # collective: each rank keeps its slice
            self.comm.put_partitioned(self.store, key, src, tier=self.tier, overwrite=True)
            s.owned = self.comm.owned_range(s.numel)
        s.param = p
        self.ws.slots.append(s)
        with _no_tf():
            p.data = s.placeholder
        p.__class__ = OffloadedParameter
        p._strata_slot = s
        p._strata_owner = self
        return s

    def _copy_object(self, s: Slot, key: str) -> None:
        """``s``'s stored value (this rank's part) also as ``key``."""
        bf16 = "bf16" if s.dtype == torch.bfloat16 else None
        if self.comm is None:
            self.store.put(key, self.store.get(s.key), tier=self.tier, overwrite=True, dtype=bf16)
            return
        part = (self.store.get(s.key + "#part") if s.state_numel else
                torch.empty(0, dtype=s.dtype))
        self.comm.put_partitioned_slice(self.store, key, part, s.shape,
                                        dtype=bf16 if not torch.is_tensor(part) else None,
                                        tier=self.tier, overwrite=True)

    def _delete_object(self, s: Slot) -> None:
        if self.comm is None:
            self.store.delete(s.key)
        else:
            import strata.distributed as sd
            sd.remove_partitioned(self.store, s.key)

    def _init_offload(self, p: torch.nn.Parameter) -> None:
        """offload_init: a parameter just registered by a module under construction."""
        if type(p) is OffloadedParameter or not p.is_floating_point() or p.is_sparse:
            return
        self._init_count += 1
        self._offload(p, f"#init{self._init_count}", f"{self.key_prefix}#init/{self._init_count}")

    def attach(self, model: torch.nn.Module, resume: bool = False,
               overwrite: bool = False) -> "ParameterOffload":
        """Makes ``model``'s parameters this offload's, named as ``model.named_parameters()``
        (see :func:`offload_parameters` for the arguments and errors): parameters
        offloaded by :func:`offload_init` are renamed (copied to their named keys, one at a
        time), the others are stored now. Installs the model's hooks. Once per offload.

        :returns: self.
        """
        self._check_open()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"offload_parameters: model must be a torch.nn.Module, got "
                            f"{type(model).__name__}")
        if self._model is not None:
            raise ValueError("offload_parameters: this ParameterOffload has a model already")
        if resume and overwrite:
            raise ValueError("offload_parameters: resume=True keeps the stored parameters "
                             "that overwrite=True replaces: pass one of them")
        named = [(n, p) for n, p in model.named_parameters()]
        for n, p in named:
            if type(p) is OffloadedParameter and p._strata_owner is not self:
                raise ValueError(f"offload_parameters: parameter {n!r} is offloaded already")
            if not p.is_floating_point():
                raise ValueError(f"offload_parameters: parameter {n!r} has dtype {p.dtype}; "
                                 "floating-point parameters only")
            if p.is_sparse:
                raise ValueError(f"offload_parameters: parameter {n!r} is sparse")
        existing = set(self.store.keys(self.key_prefix))
        if self.comm is not None:  # partitioned objects: named by their meta records
            existing = {k[:-len("#partmeta")] for k in existing if k.endswith("#partmeta")}
        for n, p in named:
            key = f"{self.key_prefix}{n}"
            if resume and self.comm is not None:
                if key not in existing:
                    raise strata.NotFoundError(
                        f"offload_parameters(resume=True): rank {self.comm.rank}'s store holds "
                        f"no part of parameter {n!r} (key {key!r})")
            elif resume:
                if key not in existing:
                    raise strata.NotFoundError(
                        f"offload_parameters(resume=True): the store holds no parameter "
                        f"{n!r} (key {key!r})")
                info = self.store.stat(key)
                if info.nbytes != p.numel() * p.element_size():
                    raise ValueError(f"offload_parameters(resume=True): parameter {n!r} has "
                                     f"{p.numel() * p.element_size()} bytes ({p.dtype}), the "
                                     f"stored one {info.nbytes} ({info.dtype})")
            elif key in existing and not overwrite:
                raise strata.AlreadyExistsError(
                    f"offload_parameters: the store already holds parameter {n!r} (key "
                    f"{key!r}): pass resume=True to continue from the stored values, "
                    "overwrite=True to replace them, or another key_prefix")
        self.ws.release_all()
        old = {id(s.param): s for s in self.ws.slots}
        slots: List[Slot] = []
        for i, (n, p) in enumerate(named):
            key = f"{self.key_prefix}{n}"
            s = old.pop(id(p), None)
            if s is None:
                s = self._offload(p, n, key)
                self.ws.slots.pop()
            elif s.key != key:  # from offload_init: to its named key
                if not resume:
                    self._copy_object(s, key)
                self._delete_object(s)
                s.key, s.grad_key, s.name = key, f"{key}#grad", n
            s.index = i
            slots.append(s)
        for s in old.values():  # made under offload_init but not in the model: back home
            self._restore(s)
            self._delete_object(s)
        self.ws.slots[:] = slots
        self.store.flush()
        self._model = model
        self._hook_handles.append(model.register_forward_pre_hook(self._forward_begin))
        self._hook_handles.append(model.register_forward_hook(self._forward_end))
        original = model.zero_grad

        def zero_grad(set_to_none: bool = False) -> None:
            self.zero_grad(set_to_none)
            original(set_to_none)

        zero_grad.__doc__ = original.__doc__
        model.zero_grad = zero_grad  # type: ignore[assignment]
        self._model_zero_grad = original
        return self

    # ---- forward / backward --------------------------------------------------------------

    def _forward_begin(self, module: torch.nn.Module, inputs: Any) -> None:
        self.ws.begin_phase(("forward", module.training, torch.is_grad_enabled()))

    def _forward_end(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.ws.end_phase()

    def _pack(self, t: torch.Tensor) -> Any:
        if type(t) is OffloadedParameter:
            return _Packed(t._strata_slot, None)
        base = t._base
        if base is not None and type(base) is OffloadedParameter:
            s = base._strata_slot
            if s.resident is not None:
                off = t.storage_offset() - s.resident.storage_offset()
                return _Packed(s, (t.size(), t.stride(), off))
        return t

    def _unpack(self, x: Any) -> torch.Tensor:
        if type(x) is not _Packed:
            return x
        owner = x.slot.param._strata_owner  # (another offload's parameter in the same op)
        owner._backward_phase()
        data = owner.ws.materialize(x.slot)
        if x.geometry is None:
            return data
        size, stride, off = x.geometry
        return data.as_strided(size, stride, data.storage_offset() + off)

    def _backward_phase(self) -> None:
        if self.ws.phase != ("backward",):
            self.ws.begin_phase(("backward",))

    def _materialize(self, slots: List[Slot]) -> None:
        """Every slot of one operation's arguments in memory together."""
        ws = self.ws
        prev = ws.protected
        ws.protected = prev | {s.index for s in slots}
        try:
            for s in slots:
                ws.materialize(s)
        finally:
            ws.protected = prev

    def _adopt(self, s: Slot, value: torch.Tensor) -> None:
        """``p.data = value``: the slot's data is ``value`` (stored when released)."""
        ws = self.ws
        if s.pending is not None:
            ws.drain()
        if s.resident is None:
            ws.resident_bytes += s.nbytes
        ws._lru[s.index] = None
        ws._lru.move_to_end(s.index)
        s.resident = value
        with _no_tf():
            s.param.data = value
        s.mark = -1  # dirty: stored when released

    # ---- values --------------------------------------------------------------------------

    def _slot(self, p: Any) -> Slot:
        if type(p) is not OffloadedParameter or p._strata_owner is not self:
            raise KeyError("not a parameter offloaded by this ParameterOffload")
        return p._strata_slot

    def read(self, p: torch.Tensor) -> torch.Tensor:
        """The current value of offloaded parameter ``p`` (a new CPU tensor of its shape and
        dtype; the materialized data when it is in memory, else read from the store)."""
        s = self._slot(p)
        if s.resident is not None:
            with _no_tf():
                return s.resident.detach().cpu().clone()
        return self.ws.read(s).view(s.shape)

    def read_state(self, p: torch.Tensor) -> torch.Tensor:
        """What an optimizer of this rank steps of ``p``: its value (flat) in one process,
        this rank's slice with a communicator (no collective). A new CPU tensor."""
        s = self._slot(p)
        if s.owned is None:
            return self.read(p).reshape(-1)
        b, e = s.owned
        if s.resident is not None:
            with _no_tf():
                return s.resident.detach().reshape(-1)[b:e].cpu().clone()
        if e == b:
            return torch.zeros(0, dtype=s.dtype)
        return tensor_of(self.store._s.get(s.key + "#part"), s.dtype)

    def state_numel(self, p: torch.Tensor) -> int:
        """Elements of read_state(p)."""
        return self._slot(p).state_numel

    def write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Stores ``value`` (any dtype, converted; ``state_numel(p)`` elements: the whole
        parameter, or this rank's slice with a communicator) as ``p``'s value; a
        materialized copy is updated (one process) or released (ranks: the other slices
        change too). Used by the optimizer's step and resume. No collective."""
        s = self._slot(p)
        with _no_tf():
            flat = value.detach().reshape(-1).to(dtype=s.dtype, device="cpu").contiguous()
        if flat.numel() != s.state_numel:
            raise ValueError(f"offloaded parameter {s.name!r}: {flat.numel()} elements "
                             f"written, {s.state_numel} expected")
        s.version += 1
        if s.owned is None:
            self.store.put(s.key, flat, tier=self.tier, overwrite=True)
            self.ws.set_value(s, flat)
            return
        if flat.numel():
            self.store.put(s.key + "#part", flat, tier=self.tier, overwrite=True)
        self.ws.release(s, write_back=False)

    def write_back(self) -> None:
        """Stores every materialized parameter changed in place since it was fetched."""
        for s in self.ws.slots:
            self.ws.write_back(s)

    def version(self, p: torch.Tensor) -> int:
        """Counts the changes of ``p``'s stored value (edits written back, steps)."""
        return self._slot(p).version

    @property
    def parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of every offloaded parameter, in the model's order."""
        return [(s.name, s.param) for s in self.ws.slots]

    # ---- statistics ----------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Sets every counter of :meth:`stats` to zero."""
        for k in ("bytes_fetched", "fetch_seconds", "stall_seconds", "prefetch_hits",
                  "prefetch_misses", "resident_hits", "trace_mismatches",
                  "peak_working_set_bytes", "bytes_written_back", "grad_bytes_written",
                  "grad_bytes_read"):
            self._stats[k] = 0 if not k.endswith("seconds") else 0.0

    def stats(self) -> Dict[str, Any]:
        """Counters since the last :meth:`reset_stats` (a new dict):

        ``bytes_fetched`` (parameter bytes read from the store, int), ``bytes_fetched_<tier>``
        (the same, by the tier holding them), ``fetch_seconds`` (time spent reading them,
        seconds, on whichever thread read), ``stall_seconds`` (time forward/backward waited
        for a parameter), ``prefetch_hits`` (uses found in flight or fetched ahead),
        ``prefetch_misses`` (uses fetched on demand), ``resident_hits`` (uses found in
        memory), ``trace_mismatches`` (phases whose order differed from the trace),
        ``peak_working_set_bytes`` (most materialized + in-flight bytes at once),
        ``working_set_bytes`` (the budget), ``bytes_written_back`` (edited parameters
        stored), ``grad_bytes_written`` / ``grad_bytes_read`` (gradients to / from the
        store).
        """
        out = dict(self._stats)
        out[f"bytes_fetched_{self.tier}"] = out["bytes_fetched"]
        out["working_set_bytes"] = self.working_set_bytes
        out["resident_bytes"] = self.ws.resident_bytes
        return out

    # ---- lifetime ------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Makes the parameters durable: edits written back, the store flushed. (A strata
        optimizer's checkpoint() holds the masters the parameters resume from; call both,
        or only the optimizer's: its resume writes the masters into the parameters.)"""
        self._check_open()
        self.write_back()
        self.store.flush()

    def _check_open(self) -> None:
        if self._closed:
            raise strata.FailedPreconditionError("ParameterOffload is closed")

    def close(self, restore: bool = True) -> None:
        """Ends the offload. ``restore``: the parameters get their values back in memory
        (plain ``torch.nn.Parameter`` objects again, the same objects); else they keep only
        their stored values (the store stays usable with resume=True). Idempotent."""
        if self._closed:
            return
        self._closed = True
        error: Optional[BaseException] = None
        try:
            self.flush_grads()
            self.ws.release_all()
            self.ws.stop()
            for h in self._hook_handles:
                h.remove()
            if self._model is not None:
                self._model.zero_grad = self._model_zero_grad  # type: ignore[assignment]
            if restore:
                for s in self.ws.slots:
                    self._restore(s)
            self.store.flush()
        except BaseException as e:  # noqa: BLE001 (raised after the release)
            error = e
        strata._lifetime.unregister(self.store, self)
        self._close_store()
        if error is not None:
            raise error

    def _restore(self, s: Slot) -> None:
        """``s``'s parameter in memory again, a plain torch.nn.Parameter (same object)."""
        p = s.param
        value = self.ws.read(s).view(s.shape)
        with _no_tf():
            p.data = value.to(s.device)
        p.__class__ = torch.nn.Parameter
        del p._strata_slot, p._strata_owner

    def _close_store(self) -> None:
        if self._owns_store and self.store is not None and not self.store.closed:
            self.store.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def __enter__(self) -> "ParameterOffload":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def offload_parameters(model: torch.nn.Module, store: Optional[strata.Store] = None, *,
                       path: Optional[str] = None, working_set: Union[int, str] = "1GiB",
                       tier: str = "nvme", key_prefix: str = "params/", prefetch: bool = True,
                       resume: bool = False, overwrite: bool = False, comm: Any = None,
                       average_gradients: bool = True) -> ParameterOffload:
    """Moves every parameter of ``model`` into a strata store; they are materialized in a
    working set of at most ``working_set`` bytes while forward and backward use them (see
    the module doc). ``model(x)``, ``loss.backward()`` and the optimizer calls stay as
    they were; pass the model's parameters to ``strata.torch.OffloadAdam``/``OffloadAdamW``
    (created after this call) to have gradients and optimizer state offloaded too.

    :param model: the module (CPU or CUDA parameters; floating point). Its parameter
        objects are kept (their class becomes :class:`OffloadedParameter`).
    :param store: the strata.Store to use (not closed by the offload). Default: a store
        at ``path`` (durability "flush", 4 MiB chunks), a temporary one when ``path`` is None
        too (removed by :meth:`ParameterOffload.close`).
    :param working_set: bytes (int or "2GiB") of parameter data in memory at once,
        prefetches included. A parameter larger than it is still fetched, alone.
    :param tier: "nvme" or "host": the store tier of the parameters and gradients.
    :param key_prefix: store keys are ``<key_prefix><parameter name>`` (gradients: ``#grad``
        appended). Default "params/".
    :param prefetch: fetch ahead along the order traced in the previous forward/backward of
        the same kind (default True; False: on demand only).
    :param resume: take the parameters' values from the store (as left by an earlier
        offload or a strata optimizer's resume) instead of the model's.
    :param overwrite: replace parameters already stored under ``key_prefix``.
    :param comm: a ``strata.distributed.Communicator`` of a data-parallel job (ZeRO-3): every
        rank calls this with the same model; each parameter becomes a partitioned object
        (rank r keeps its slice in its own ``store``), a parameter is assembled by
        ``fetch_partitioned`` (every rank reads its slice, then all-gather) and gradients are
        reduce-scattered to their owners, so each rank's optimizer steps its slices. Ranks
        must use the parameters in the same order (the same model code on the same shapes),
        as every fetch is a collective. Default None (one process; also a size-1 comm).
    :param average_gradients: with ``comm``: the reduced gradients are divided by the
        number of ranks (DDP's mean); False: summed.
    :returns: the :class:`ParameterOffload` handle (stats, grad, read, checkpoint, close).
    :raises TypeError: ``model`` is not a Module.
    :raises ValueError: a non-floating-point or sparse parameter (named), a parameter
        offloaded already, ``working_set`` <= 0, an unknown tier, resume with overwrite, a
        stored parameter of another size (resume).
    :raises strata.AlreadyExistsError: the store holds a parameter under the prefix (neither
        resume nor overwrite).
    :raises strata.NotFoundError: resume and a parameter missing from the store.
    """
    handle = ParameterOffload(store, path, working_set, tier, key_prefix, prefetch, resume,
                              comm, average_gradients)
    try:
        return handle.attach(model, resume=resume, overwrite=overwrite)
    except BaseException:
        handle.close(restore=False)
        raise


@contextlib.contextmanager
def offload_init(store: Optional[strata.Store] = None, *, path: Optional[str] = None,
                 working_set: Union[int, str] = "1GiB", tier: str = "nvme",
                 key_prefix: str = "params/", prefetch: bool = True,
                 resume: bool = False, comm: Any = None,
                 average_gradients: bool = True) -> Iterator[ParameterOffload]:
    """Constructs a model whose parameters never all exist in memory (the counterpart of
    DeepSpeed's ``zero.Init``): every parameter a module registers inside the ``with``
    block is stored and released at once, so construction takes the largest parameter's
    memory, not the model's; initialization in place afterwards (``nn.init.normal_(p)``,
    ``reset_parameters``) materializes each parameter in the working set and stores the
    result. Then attach the model to the handle, which names its parameters::

        with strata.torch.offload_init(store, working_set="64MiB") as h:
            model = GPT(...)
        h.attach(model)                     # as offload_parameters(model, store, ...)

    Arguments as :func:`offload_parameters`. Parameters registered in the block but not in
    the attached model get their values back in memory at attach(). Thread-safety: patches
    ``torch.nn.Module.register_parameter`` for the block's duration (process-wide): no
    other thread may build modules meanwhile.

    :raises ValueError: as offload_parameters; a nested offload_init.
    """
    global _INIT_ACTIVE
    if _INIT_ACTIVE:
        raise ValueError("offload_init: already inside an offload_init block")
    handle = ParameterOffload(store, path, working_set, tier, key_prefix, prefetch, resume,
                              comm, average_gradients)
    original = torch.nn.Module.register_parameter

    def register_parameter(module: torch.nn.Module, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None:
            handle._init_offload(param)

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[assignment]
    _INIT_ACTIVE = True
    try:
        yield handle
    except BaseException:
        torch.nn.Module.register_parameter = original  # type: ignore[assignment]
        _INIT_ACTIVE = False
        handle.close()
        raise
    torch.nn.Module.register_parameter = original  # type: ignore[assignment]
    _INIT_ACTIVE = False


_INIT_ACTIVE = False
