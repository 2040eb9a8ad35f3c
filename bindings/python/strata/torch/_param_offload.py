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
Backward reads parameters through autograd's saved-tensor hooks (installed for the
model's forward): a saved parameter (or a view of one, as ``F.linear`` saves) is stored as
a reference and fetched again when backward needs it, so a released parameter is never
read stale. In-place changes of a materialized parameter (``p.clamp_()`` under no_grad,
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
        if slots:
            owner = slots[0].param._strata_owner
            owner._materialize(slots)
        with _no_tf():
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


class _Packed:
    """What autograd saves for an offloaded parameter (or a view of one): the slot and the
    view's geometry (size, stride, offset from the data's first element)."""

    __slots__ = ("slot", "geometry")

    def __init__(self, slot: Slot, geometry: Optional[Tuple[Any, Any, int]]):
        self.slot = slot
        self.geometry = geometry


class ParameterOffload:
    """What :func:`offload_parameters` returns: the offloaded parameters of one model.

    Attributes: ``store`` (the strata.Store), ``working_set_bytes`` (the budget, bytes),
    ``tier``, ``key_prefix``. See :meth:`stats` for the counters.
    """

    def __init__(self, model: torch.nn.Module, store: Optional[strata.Store], path: Optional[str],
                 working_set: Union[int, str], tier: str, key_prefix: str, prefetch: bool,
                 resume: bool, overwrite: bool):
        self._closed = True
        self._owns_store = False
        self._owned_dir: Optional[str] = None
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"offload_parameters: model must be a torch.nn.Module, got "
                            f"{type(model).__name__}")
        if tier not in ("nvme", "host"):
            raise ValueError(f"offload_parameters: tier must be 'nvme' or 'host', got {tier!r}")
        budget = strata.parse_size(working_set) if isinstance(working_set, str) else int(working_set)
        if budget <= 0:
            raise ValueError(f"offload_parameters: working_set must be > 0 bytes, got "
                             f"{working_set!r}")
        if resume and overwrite:
            raise ValueError("offload_parameters: resume=True keeps the stored parameters "
                             "that overwrite=True replaces: pass one of them")
        named = [(n, p) for n, p in model.named_parameters()]
        for n, p in named:
            if type(p) is OffloadedParameter:
                raise ValueError(f"offload_parameters: parameter {n!r} is offloaded already")
            if not p.is_floating_point():
                raise ValueError(f"offload_parameters: parameter {n!r} has dtype {p.dtype}; "
                                 "floating-point parameters only")
            if p.is_sparse:
                raise ValueError(f"offload_parameters: parameter {n!r} is sparse")
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
        self._stats: Dict[str, float] = {}
        self.reset_stats()
        self.ws = WorkingSet(store, budget, prefetch, self._stats)
        self._model = model
        self._grad_writes: Dict[int, Tuple[Any, torch.Tensor]] = {}  # slot -> (future, grad)
        self._grad_inflight = 0
        self._accumulators: List[Any] = []
        self._hook_handles: List[Any] = []
        self._hooks_ctx: Optional[Any] = None
        self._depth = 0
        try:
            self._register(named, resume, overwrite)
        except BaseException:
            self._close_store()
            raise
        self._closed = False
        self._install_hooks(model)
        strata._lifetime.register(self.store, self)

    # ---- setup ---------------------------------------------------------------------------

    def _register(self, named: List[Tuple[str, torch.nn.Parameter]], resume: bool,
                  overwrite: bool) -> None:
        existing = set(self.store.keys(self.key_prefix))
        for i, (n, p) in enumerate(named):
            key = f"{self.key_prefix}{n}"
            s = Slot(i, n, key, f"{self.key_prefix}{n}#grad", p)
            if resume:
                if key not in existing:
                    raise strata.NotFoundError(
                        f"offload_parameters(resume=True): the store holds no parameter "
                        f"{n!r} (key {key!r})")
                info = self.store.stat(key)
                if info.numel != s.numel:
                    raise ValueError(f"offload_parameters(resume=True): parameter {n!r} has "
                                     f"{s.numel} elements, the stored one {info.numel}")
            else:
                if key in existing and not overwrite:
                    raise strata.AlreadyExistsError(
                        f"offload_parameters: the store already holds parameter {n!r} (key "
                        f"{key!r}): pass resume=True to continue from the stored values, "
                        "overwrite=True to replace them, or another key_prefix")
                with _no_tf():
                    src = p.detach().reshape(-1).contiguous()
                    if src.device.type != "cpu":
                        src = src.cpu()
                self.store.put(key, src, tier=self.tier, overwrite=True)
            s.param = p
            self.ws.slots.append(s)
        self.store.flush()
        for s in self.ws.slots:
            p = s.param
            with _no_tf():
                p.data = s.placeholder
            p.__class__ = OffloadedParameter
            p._strata_slot = s
            p._strata_owner = self

    def _install_hooks(self, model: torch.nn.Module) -> None:
        self._hook_handles.append(model.register_forward_pre_hook(self._forward_begin))
        self._hook_handles.append(model.register_forward_hook(self._forward_end))
        original = model.zero_grad

        def zero_grad(set_to_none: bool = False) -> None:
            self.zero_grad()
            original(set_to_none)

        zero_grad.__doc__ = original.__doc__
        model.zero_grad = zero_grad  # type: ignore[assignment]
        self._model_zero_grad = original

    # ---- forward / backward --------------------------------------------------------------

    def _forward_begin(self, module: torch.nn.Module, inputs: Any) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        if self._hooks_ctx is not None:  # the last forward raised: its hooks are still on
            self._hooks_ctx.__exit__(None, None, None)
            self._hooks_ctx = None
        self.ws.begin_phase(("forward", module.training, torch.is_grad_enabled()))
        if torch.is_grad_enabled():
            self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._hooks_ctx.__enter__()

    def _forward_end(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        if self._hooks_ctx is not None:
            self._hooks_ctx.__exit__(None, None, None)
            self._hooks_ctx = None
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
        self._backward_phase()
        data = self.ws.materialize(x.slot)
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

    # ---- gradients -----------------------------------------------------------------------

    def bind_optimizer(self, p: OffloadedParameter, clip: bool) -> None:
        """A strata optimizer holds ``p``: its gradients go to the store from now on
        (``clip``: their L2 norms are kept for clipping). Called by OffloadAdam/AdamW."""
        s = p._strata_slot
        s.to_store = True
        self._clip = getattr(self, "_clip", False) or clip
        if not any(a[0] is s for a in self._accumulators):
            with _no_tf():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._grad_hook(s))
            self._accumulators.append((s, acc))

    def _grad_hook(self, s: Slot):
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            self._grad_ready(s)
        return hook

    def _grad_ready(self, s: Slot) -> None:
        """``s.param.grad`` was accumulated by torch: moved to the store (added to the
        stored one when this step already has one, as torch's ``p.grad += g``)."""
        if not s.to_store:
            return
        self._backward_phase()
        p = s.param
        with _no_tf():
            g = p.grad
            if g is None:
                return
            p.grad = None
            g = g.detach()
            if g.is_sparse:
                raise RuntimeError(f"offloaded parameter {s.name!r}: sparse gradients are "
                                   "not supported")
            if g.device.type != "cpu":
                g = g.cpu()
            if s.has_grad:
                old = self._read_grad(s)
                old.add_(g.reshape(old.shape))
                g = old
            else:
                g = g.contiguous()
            s.has_grad = True
            s.grad_finite = bool(torch.isfinite(g).all())
            s.grad_norm = torch.norm(g, 2.0) if self._clip else None
        self._write_grad(s, g)

    def _write_grad(self, s: Slot, g: torch.Tensor) -> None:
        nbytes = g.numel() * g.element_size()
        while self._grad_writes and self._grad_inflight + nbytes > self.working_set_bytes // 2:
            self._wait_grad(next(iter(self._grad_writes)))
        fut = self.store.put_async(s.grad_key, g.reshape(-1), tier=self.tier, overwrite=True)
        self._grad_writes[s.index] = (fut, g)
        self._grad_inflight += nbytes
        self._stats["grad_bytes_written"] += nbytes

    def _wait_grad(self, index: int) -> None:
        fut, g = self._grad_writes.pop(index)
        self._grad_inflight -= g.numel() * g.element_size()
        fut.result()

    def flush_grads(self) -> None:
        """Waits for every gradient write in flight (errors are raised here)."""
        while self._grad_writes:
            self._wait_grad(next(iter(self._grad_writes)))

    def _read_grad(self, s: Slot) -> torch.Tensor:
        if s.index in self._grad_writes:
            self._wait_grad(s.index)
        g = tensor_of(self.store._s.get(s.grad_key), s.dtype).view(s.shape)
        self._stats["grad_bytes_read"] += s.nbytes
        return g

    def grad(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """The gradient of offloaded parameter ``p`` accumulated since the last zero_grad
        (a new CPU tensor of its shape and dtype), or ``p.grad`` when its gradients stay in
        memory; None when it has none.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._slot(p)
        if not s.to_store:
            with _no_tf():
                return p.grad
        return self._read_grad(s) if s.has_grad else None

    def zero_grad(self) -> None:
        """Forgets the stored gradients (the next backward starts them afresh), as
        ``optimizer.zero_grad()`` does for gradients in memory. Called by the model's and
        strata optimizers' ``zero_grad``."""
        self.flush_grads()
        for s in self.ws.slots:
            s.has_grad = False
            s.grad_norm = None
            s.grad_finite = True

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
        return tensor_of(self.store._s.get(s.key), s.dtype).view(s.shape)

    def write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Stores ``value`` (any dtype, converted; ``p``'s number of elements) as ``p``'s
        value: the materialized data too, when in memory. Used by the optimizer's step."""
        s = self._slot(p)
        with _no_tf():
            flat = value.detach().reshape(-1).to(dtype=s.dtype, device="cpu").contiguous()
        self.store.put(s.key, flat, tier=self.tier, overwrite=True)
        s.version += 1
        self.ws.set_value(s, flat)

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
            if self._hooks_ctx is not None:
                self._hooks_ctx.__exit__(None, None, None)
                self._hooks_ctx = None
            for h in self._hook_handles:
                h.remove()
            self._model.zero_grad = self._model_zero_grad  # type: ignore[assignment]
            for s in self.ws.slots:
                p = s.param
                value = (tensor_of(self.store._s.get(s.key), s.dtype).view(s.shape).clone()
                         if restore else None)
                if restore:
                    with _no_tf():
                        p.data = value.to(s.device)
                    p.__class__ = torch.nn.Parameter
                    del p._strata_slot, p._strata_owner
            self.store.flush()
        except BaseException as e:  # noqa: BLE001 (raised after the release)
            error = e
        strata._lifetime.unregister(self.store, self)
        self._close_store()
        if error is not None:
            raise error

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
                       resume: bool = False, overwrite: bool = False) -> ParameterOffload:
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
    :returns: the :class:`ParameterOffload` handle (stats, grad, read, checkpoint, close).
    :raises TypeError: ``model`` is not a Module.
    :raises ValueError: a non-floating-point or sparse parameter (named), a parameter
        offloaded already, ``working_set`` <= 0, an unknown tier, resume with overwrite, a
        stored parameter of another size (resume).
    :raises strata.AlreadyExistsError: the store holds a parameter under the prefix (neither
        resume nor overwrite).
    :raises strata.NotFoundError: resume and a parameter missing from the store.
    """
    return ParameterOffload(model, store, path, working_set, tier, key_prefix, prefetch,
                            resume, overwrite)
