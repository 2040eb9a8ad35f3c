"""The offloaded torch optimizer under OffloadAdam/OffloadAdamW: a
``torch.optim.Optimizer`` whose fp32 masters and optimizer state live in strata's C++
OffloadedOptimizer (``_opt``).

It holds its parts by composition, one chain of ownership: the parameter table (``_table``,
optim/_param_table.py: parameters <-> strata handles; its ``core`` is ``_opt``), the
registry (``_registry``, optim/_registry.py: param groups and parameters into strata),
``state`` (optim/_state_view.py), the tensor exchange (``_exchange``, optim/_exchange.py:
gradients in, weights out), the checkpoint side (``_checkpoints``, optim/_checkpoints.py),
the backward overlap (``_overlap``, optim/_overlap.py) and torch's keyword arguments
(``_flags``, optim/_torch_kwargs.py). Here: the members' setup, the order of work of
step(), checkpoint(), state dicts and close(); the step's paths are in optim/_step.py.
Members call back into the optimizer only through weak callables (``del opt`` closes it).

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, Optional

import torch

import strata

from ..._data_dir import make_temp_dir
from ..offload import offload_of
from . import _hyperparams, _layout, _settings
from ._checkpoints import Checkpoints
from ._exchange import TensorExchange, bump_version
from ._grad_accum import GradAccumulation
from ._optimizer_io import CheckpointMethods
from ._overlap import CHANGED, CLOSURE, EDITED, STATE_USED, BackwardOverlap
from ._param_table import ParamTable, offloads
from ._registry import ParamRegistry
from ._state_view import StateView
from ._step import run_step
from ._torch_kwargs import TorchFlags


def _weak_call(obj: Any, method: str, default: Any = None) -> Callable[[], Any]:
    """``obj.<method>()`` through a weak reference (``default`` once ``obj`` is gone): what
    the optimizer's members call back without keeping it alive (``del opt`` closes it)."""
    ref = weakref.ref(obj)

    def call() -> Any:
        o = ref()
        return default if o is None else getattr(o, method)()
    return call


def _held_by(table: ParamTable) -> Callable[[torch.Tensor], bool]:
    """``holds(p)`` of the GradAccumulation: ``p`` is among ``table``'s parameters (its
    param groups' now), through a weak reference (False once the table is gone)."""
    ref = weakref.ref(table)

    def holds(p: torch.Tensor) -> bool:
        t = ref()
        return t is not None and id(p) in t.handle
    return holds


class OffloadedTorchOptimizer(CheckpointMethods, torch.optim.Optimizer):
    """A torch optimizer over strata's offloaded step (OffloadAdam/OffloadAdamW's base:
    they check and resolve the arguments, documented there, then call this constructor).

    :param params, defaults: as torch.optim.Optimizer.
    :param rule: strata's rule ("adam" / "adamw").
    :param flags: the class's torch keyword arguments.
    :param settings: the resolved pipeline settings (optim/_settings.py), ``counts`` their
        checked sub_group_numel, num_buffers, num_threads; ``chunk_size`` of a store this
        optimizer opens.
    :param store, path, key_prefix, max_grad_norm, resume, overwrite: as OffloadAdam.
    :param grad_accumulation: "float32" or "param" (OffloadAdam's ``grad_accumulation_dtype``
        resolved by optim/_grad_accum.py's check_option).
    """

    _grad_scale = None  #: 1/loss scale while a DynamicLossScaler steps (optim/_loss_scale.py)

    def __init__(self, params: Iterable[Any], defaults: Dict[str, Any], *, rule: str,
                 flags: TorchFlags, settings: Dict[str, Any], counts: Dict[str, int],
                 chunk_size: Any, store: Optional[strata.Store], path: Optional[str],
                 key_prefix: str, max_grad_norm: float, resume: bool, overwrite: bool,
                 grad_accumulation: str = "float32", state_dtype: str = "fp32"):
        # What close() needs, first: close() must work on a half-constructed object.
        self._opt = None
        self.store = None
        self._owns_store = False
        self._owned_dir: Optional[str] = None
        self._closed = False
        self._ready = False  # set at the end of __init__; add_param_group registers after
        self._rule = rule
        self._flags = flags
        self._table = ParamTable()
        self._overlap: Optional[BackwardOverlap] = None
        #: fp32 sums of fp16/bf16 parameters' micro-batch gradients (optim/_grad_accum.py)
        self._accum = self._table.accum = GradAccumulation(grad_accumulation,
                                                           _held_by(self._table))
        #: the pipeline settings in effect (after the configuration file)
        self.settings: Dict[str, Any] = settings
        tier, arithmetic = settings["tier"], settings["arithmetic"]
        self._registry = ParamRegistry(self._table, rule, flags, tier)
        super().__init__(params, defaults)  # checks the parameters' dtypes
        #: torch's per-parameter state, read from strata on access (see optim/_state_view.py)
        self.state = StateView(self._table, _weak_call(self, "_abort_overlap"))  # type: ignore
        for gi, group in enumerate(self.param_groups):
            _hyperparams.check(self._rule, group, f"param group {gi}: ")
            self._flags.check(group, f"param group {gi}: ")

        self.max_grad_norm = max_grad_norm
        self.tier = tier
        self._key_prefix = key_prefix
        #: cumulative bytes moved, by tier and direction
        #: (nvme_* from strata's step statistics; the others: see optim/_exchange.py)
        self.bytes_moved: Dict[str, int] = dict(nvme_read=0, nvme_written=0, host_grads_read=0,
                                                host_weights_written=0, host_copies=0,
                                                device_to_host=0, host_to_device=0)
        self._exchange = TensorExchange(self.bytes_moved)
        #: stats of the last step (dict from strata: bytes_read, bytes_written, grad_norm, ...)
        self.last_step: Dict[str, Any] = {}
        try:
            if store is None:
                self._owns_store = True
                if path is None:
                    path = self._owned_dir = make_temp_dir("optim-")
                # resume: never create a store (a missing one is NotFound, nothing is made)
                store = strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                           chunk_size=chunk_size, create=not resume,
                                           config=settings["config"])
            self.store = store
            self._checkpoints = Checkpoints(self._table, store, key_prefix, tier, self._rule,
                                            self._flags)
            self._registry.checkpoints = self._checkpoints
            self._opt = self._checkpoints.open_core(
                resume, overwrite, path, _hyperparams.to_strata(self.param_groups[0]),
                dict(sub_group_numel=counts["sub_group_numel"],
                     num_buffers=counts["num_buffers"], pinned_budget=settings["pinned_budget"],
                     host_budget=settings["host_budget"], num_threads=counts["num_threads"],
                     arithmetic=arithmetic, state_dtype=state_dtype), type(self).__name__)
            if resume:  # the registry registers the checkpoint's parameters while set
                self._registry.prepare_resume(self.param_groups, key_prefix)
            for gi, group in enumerate(self.param_groups):
                self._registry.register_group(gi, group)
            if resume:
                self._checkpoints.finish_legacy_resume(self._registry.resume_handles)
                self._registry.finish_resume()
            self._table.rebuild(self.param_groups)
        except BaseException:
            self.close()
            raise
        self._registry.resume_handles = None
        self._accum.watch(self._table.params)  # (new parameters: at each step, _step.py)
        overlap = settings["overlap_backward"]
        if overlap:
            bucket = _settings.check_count("overlap_bucket_numel",
                                           settings["overlap_bucket_numel"]) or 1
            self._overlap = BackwardOverlap(self._table, self._exchange, self.bytes_moved,
                                            _weak_call(self, "_prepare_early_step"), bucket,
                                            store=self.store)
            for p in self._table.params:
                self._overlap.watch(p)
            self._overlap.link_offloaded()
            self._registry.on_new_param = self._overlap.watch
        self._ready = True
        strata._lifetime.register(self.store, self)  # closed before its store, and at exit

    # ---- setup ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise strata.FailedPreconditionError(f"{type(self).__name__} is closed")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As torch.optim.Optimizer.add_param_group; the group's parameters must be fp32,
        fp16 or bf16 and its hyperparameters in range (ValueError naming the parameter index
        and dtype, or the value, before anything is added). Added after construction (also
        after a resume), its parameters start fresh: masters from their current values."""
        if self._ready:
            self._check_open()
        param_group = self._registry.split_names(
            param_group, len(self.param_groups), sum(len(g["params"]) for g in self.param_groups))
        if self._ready and isinstance(param_group, dict) and "params" in param_group:
            self._registry.check_group({**self.defaults, **param_group},
                                       f"param group {len(self.param_groups)}: ")
        super().add_param_group(param_group)
        if self._ready:  # after __init__: register the new group at once
            self._abort_overlap()
            try:
                self._sync_params()
            except BaseException:
                self.param_groups.pop()  # refused (e.g. DiskFullError): nothing added
                raise

    def _sync_params(self) -> bool:
        """param_groups' edits followed, changed parameters taken (optim/_registry.py);
        returns whether the parameters or their grouping changed. Parameters out of every
        group (and tensors no parameter uses) are detached: no step reads them."""
        changed = self._registry.sync_params(self.param_groups, self.defaults)
        table = self._table
        for h in [h for h, _ in table.kept()] + list(table.retired):
            self._exchange.detach(self._opt, h)
        return changed

    def _sync_hyperparams(self) -> None:
        """The groups' hyperparameters into strata when they changed."""
        self._registry.sync_hyperparams(self.param_groups)

    def mark_params_changed(self, params: Optional[Iterable[torch.Tensor]] = None) -> None:
        """Makes the next step (or checkpoint/state_dict) take the current values of
        ``params`` (default: every registered parameter) as their fp32 masters. Only needed
        after in-place edits through ``p.data``, which torch's version counter does not
        see; other changes are noticed without it (see the class doc).

        :raises KeyError: a parameter this optimizer does not hold.
        """
        self._check_open()
        table = self._table
        hs = [table.handle_of(p) for p in (table.params if params is None else params)]
        if None in hs:
            raise KeyError(f"mark_params_changed: parameter {hs.index(None)} of the given "
                           "ones is not in this optimizer")
        for h in hs:
            table.forget(h)

    def _sync_all(self) -> bool:
        """What every step, checkpoint and early update takes first: param_groups and
        parameter edits, hyperparameters, optimizer.state edits. Returns whether the
        parameters or their grouping changed."""
        changed = self._sync_params()
        self._sync_hyperparams()
        self.state.write_back()
        return changed

    # ---- stepping ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam/AdamW step of every parameter with a gradient in ``param_groups`` (see
        the module doc). Returns the closure's loss (as torch optimizers do); strata's step
        statistics are in ``self.last_step``. A step whose gradients hold inf/NaN is skipped
        entirely (``last_step["skipped"]``), as mixed-precision loss scalers expect.

        Like torch.optim, it steps from each parameter's current value: a parameter changed
        since the optimizer last wrote it (its ``_version`` or ``data_ptr()`` differ:
        ``model.load_state_dict``, ``p.clamp_()`` under no_grad, ``p.data = t``) has that
        value (fp16/bf16 widened to fp32) taken as its master first; unchanged ones are not
        copied. In-place edits through ``p.data`` are not seen: see mark_params_changed.
        Edits of ``param_groups`` are followed as torch.optim's (state keyed by the
        parameter: removed, reordered, replaced, moved, groups deleted or inserted; new
        parameters registered fresh; a parameter in no group is not stepped and keeps its
        state); a parameter moved to a group with other hyperparameters has its state
        copied once (optim/_layout.py). Betas outside [0, 1) set in a group are stepped as
        torch does. See optim/_param_table.py and docs/offload.md.

        :raises ValueError: a parameter listed twice in param_groups (naming both places:
            "param group g, params[j]"), a new group's hyperparameter out of range (torch's
            message, naming the group), a new parameter's dtype (naming its index),
            amsgrad in a new group other than the optimizer's, capturable/differentiable/
            fused set True in a group, a hyperparameter strata refuses
            (InvalidArgumentError), or a beta2 making ``1 - beta2**t`` negative (torch's
            "math domain error"); nothing is stepped.
        :raises TypeError: a ``params`` entry that is not a tensor (naming group and index).
        :raises ZeroDivisionError: a beta1 making ``1 - beta1**t`` zero (as torch).
        :raises strata.DiskFullError: the state of new or moved parameters does not fit
            (checked before any is added).
        """
        self._check_open()
        loss = None
        ov = self._overlap
        if ov is not None and ov.open and (closure is not None or not ov.still_valid()):
            ov.abort(CLOSURE if closure is not None else CHANGED)  # an ordinary step instead
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if ov is not None:
                ov.abort(CLOSURE)  # the closure's backward started updates: redo them here
        table = self._table
        if ov is not None and ov.open and (table.layout_changed(self.param_groups)
                                           or self.state.pending()
                                           or any(table.changed(table.handle[id(p)])
                                                  for p in table.params)):
            ov.abort(EDITED)  # parameters, param_groups or optimizer.state edited since
        self._sync_all()
        for gi, group in enumerate(self.param_groups):
            self._flags.check(group, f"param group {gi}: ")
            if not _hyperparams.betas_in_range(group):
                _hyperparams.check_step_betas(group, gi, (
                    self._opt.step_count(table.handle[id(p)]) + 1
                    for p in group["params"] if self._has_grad(p)))
        stats, stepped, on_gpu = run_step(table, self._exchange, ov, self.max_grad_norm,
                                          self.settings["arithmetic"] == "torch",
                                          1.0 if self._grad_scale is None else self._grad_scale)
        if ov is not None:
            ov.after_step(stats)
        self.state.invalidate()
        self.last_step = stats
        self.bytes_moved["nvme_read"] += stats["bytes_read"]
        self.bytes_moved["nvme_written"] += stats["bytes_written"]
        if stats["skipped"]:  # expected under a loss scaler: no warning then
            if self._grad_scale is None: warnings.warn(  # noqa: E701
                f"{type(self).__name__}.step(): skipped, a gradient holds inf or NaN (torch.optim"
                " would have written NaN into the parameters); nothing changed (last_step"
                "['skipped'])", RuntimeWarning, stacklevel=2)
            return loss
        for p, h in stepped:
            self._exchange.copy_back(p, h)
            bump_version(p)  # as torch.optim's in-place update (also where copied above)
            table.mark(h)
        if on_gpu:
            torch.cuda.synchronize()
        return loss

    @staticmethod
    def _has_grad(p: torch.Tensor) -> bool:
        """``p`` has a gradient for this step (in ``p.grad``, or in its offload's store)."""
        o = offload_of(p)
        return p.grad is not None if o is None else o.grad_info(p).has_grad

    def stats(self) -> Dict[str, Any]:
        """The offloaded optimizer's totals since creation or :meth:`reset_stats` (a new
        dict: ``steps``, ``sub_groups``, ``bytes_read``, ``bytes_written``,
        ``update_seconds``, ``io_wait_seconds``, ``overlap``, ... as
        ``strata.OffloadedOptimizer.stats()``). The store's counters: ``self.store.stats()``."""
        self._check_open()
        return self._opt.stats()

    def reset_stats(self) -> None:
        """Zeroes the totals of :meth:`stats`."""
        self._check_open()
        self._opt.reset_stats()

    def zero_grad(self, set_to_none: bool = False) -> None:
        """As torch.optim.Optimizer.zero_grad (offloaded parameters' stored gradients
        too, through their ``p.grad``: strata.torch.offload)."""
        for o in offloads(self._table.params):
            o.flush_grads()  # a write in flight fails here, not at an unrelated later call
        self._accum.clear()  # the fp32 sums (optim/_grad_accum.py) start again
        super().zero_grad(set_to_none)

    # ---- the step overlapped with backward --------------------------------------------------

    def accumulating(self):
        """Context manager for backward passes that must not start updates with
        ``overlap_backward=True`` (gradient accumulation: all but the last micro-batch),
        like DDP's ``no_sync()``. A no-op without overlap_backward."""
        if self._overlap is None:
            return contextlib.nullcontext()
        return self._overlap.suspended()

    def _prepare_early_step(self) -> Optional[float]:
        """BackwardOverlap's ``prepare``: what step() takes first, before the first early
        update of a backward; returns max_grad_norm, or None when that failed (step()
        raises it, as torch would, not backward)."""
        try:
            if self._sync_all():
                return None  # the grouping changed: the hooked parameter may be out of it
        except Exception:  # noqa: BLE001
            return None
        return self.max_grad_norm

    def _abort_overlap(self) -> None:
        """Rolls back an overlapped step in flight (before anything that needs the state
        after the last completed step: checkpoint, state dicts, param-group edits, close)."""
        if getattr(self, "_overlap", None) is not None and not self._closed:
            self._overlap.abort(STATE_USED)

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """The optimizer's last checkpoint, then its release: a resume
        (``resume=True``) restores the state of the last :meth:`checkpoint` or close, for
        every tier ("nvme", "host", "auto"). Closing happens here, when the optimizer is
        garbage-collected (``del opt``), when a :class:`strata.Store` it uses closes (first),
        and at interpreter exit (an ``atexit`` handler; also after Ctrl-C's
        KeyboardInterrupt). A process that dies without closing (SIGKILL, a crash, power
        loss) resumes at its last checkpoint or close; a flush of a shared store between
        steps moves nothing. The checkpoint takes the current ``param_groups``
        (e.g. a scheduler's lr) and is skipped when nothing changed since the last one, for
        an optimizer whose constructor failed, and for one in a temporary directory (which
        is removed); a ``param_groups`` that step() would refuse (a parameter listed twice)
        is not taken: the checkpoint has the layout of the last step. Then a store the optimizer opened is closed and its temporary
        directory removed. Idempotent; afterwards step/checkpoint/state_dict/
        load_state_dict/add_param_group raise strata.FailedPreconditionError
        ("OffloadAdam is closed").

        :raises strata.ResourceExhaustedError, strata.IoError: the checkpoint failed (e.g.
            disk full); everything is released all the same and the last checkpoint stays
            the resume point.
        :raises strata.FailedPreconditionError: a step failed part-way before (the state
            since the last checkpoint cannot be saved: resume from it), or the store was
            closed before the optimizer."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        error: Optional[BaseException] = None
        if self._opt is not None:
            # A half-built optimizer, or one whose temporary store is deleted below, is
            # released without a checkpoint.
            keep = self._ready and self._owned_dir is None
            try:
                if getattr(self, "_overlap", None) is not None:
                    self._overlap.unlink_all()  # linked parameters: their own values back
                if keep and self._registry.listing_error(self.param_groups) is None:
                    self._sync_all()  # param_groups, parameters changed outside: as checkpoint()
                elif keep:  # a param_groups step() refuses: the layout of the last sync
                    self._table.take_changed()
                    self.state.write_back()
                if keep:
                    _layout.write_record(self._table, self.tier)
            except Exception as e:  # noqa: BLE001 (raised below, after the release)
                error = e
                keep = False
            if self.store is not None:
                strata._lifetime.unregister(self.store, self)
            error = self._checkpoints.close_core(keep) or error
        self._opt = None
        self._table.core = None
        if getattr(self, "_accum", None) is not None:
            self._accum.close()
        if self._owns_store and self.store is not None and not self.store.closed:
            try:
                self.store.close()
            except Exception as e:  # noqa: BLE001
                error = error or e
        owned, self._owned_dir = self._owned_dir, None
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
        if error is not None:
            raise error

    def __del__(self):
        try:
            self.close()
        except Exception as e:  # noqa: BLE001 (garbage collection cannot raise)
            try:
                warnings.warn(f"{type(self).__name__} closed by garbage collection: its last "
                              f"checkpoint failed: {e}", RuntimeWarning)
            except Exception:  # noqa: BLE001 (interpreter shutdown)
                pass
