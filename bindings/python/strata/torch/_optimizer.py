"""The optimizer classes of strata.torch: OffloadAdam, OffloadAdamW (see the package doc).

Setup, param groups and the step live here; hyperparameters in _hyperparams.py, the moves
of gradients and weights in _staging.py, checkpoints and state dicts in _state_dict.py.
"""

from __future__ import annotations

import contextlib
import operator
import shutil
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

import strata

from .._data_dir import make_temp_dir
from . import _hyperparams, _names
from ._offload_step import has_offloaded, offloaded_step, owners, state_numel
from ._overlap import BackwardOverlap
from ._param_offload import OffloadedParameter
from ._param_sync import ParamTable, check_param
from ._staging import Staging, bump_version, copy_master_to_param
from ._state_dict import StateDictMixin
from ._state_view import StateView
from ._torch_kwargs import ADAM_FLAGS, ADAMW_FLAGS, TorchKwargsMixin


def _check_count(name: str, value: Any) -> int:
    """``value`` as an int >= 0, else ValueError naming the argument."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= 0, got {type(value).__name__} "
                         f"{value!r}") from None
    if v < 0:
        raise ValueError(f"{name} must be an int >= 0, got {v}")
    return v


class _OffloadAdamBase(TorchKwargsMixin, StateDictMixin, torch.optim.Optimizer):
    """The Adam/AdamW optimizers of this package (see the package doc); ``_RULE`` is
    strata's rule ("adam" / "adamw")."""

    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: Optional[float] = None, amsgrad: bool = False, *,
                 maximize: bool = False, store: Optional[strata.Store] = None,
                 path: Optional[str] = None, tier: Optional[str] = None,
                 host_budget: Optional[Union[int, str]] = None,
                 pinned_budget: Optional[Union[int, str]] = None,
                 chunk_size: Optional[Union[int, str]] = None, key_prefix: str = "optim/",
                 max_grad_norm: float = 0.0, sub_group_numel: Optional[int] = None,
                 num_buffers: Optional[int] = None, num_threads: Optional[int] = None,
                 resume: bool = False, arithmetic: Optional[str] = None,
                 overwrite: bool = False, overlap_backward: Optional[bool] = None,
                 overlap_bucket_numel: Optional[int] = None, config: Optional[str] = None,
                 **torch_kwargs: Any):
        """
        :param params: iterable of parameters or of param-group dicts (as torch.optim), or
            of ``(name, parameter)`` pairs such as ``model.named_parameters()`` (also as a
            group's ``"params"``): the names are recorded in the store's keys
            (``<key_prefix>p/p<i>:<name>/...``, shown by ``strata store ls``; see
            _names.py) and checked at a resume. Parameters must be fp32, fp16 or bf16 (CPU
            or CUDA); float64 (which fp32 masters would silently round) and complex
            parameters are refused.
        :param lr, betas, eps, weight_decay, amsgrad, maximize: as torch.optim.Adam/AdamW
            (weight_decay default: 0 for Adam, 1e-2 for AdamW). With ``resume=True`` the
            checkpoint's values win (see ``resume``).
        :param torch_kwargs: torch 1.13's other keyword arguments, in ``defaults`` and every
            param group as torch puts them: ``foreach``, ``capturable`` (both classes),
            ``differentiable``, ``fused`` (OffloadAdam only, as torch.optim.AdamW has
            neither: TypeError). ``foreach`` is accepted and has no effect (strata's step
            is its own); ``capturable=True``, ``differentiable=True`` and ``fused=True``
            raise ValueError naming the argument (a CUDA-graph-captured, differentiable or
            fused CUDA step cannot be an offloaded CPU step); so does a param group given
            or later set with one of them True (at step()).
        :param store: a :class:`strata.Store` to keep the state in (the optimizer does not
            close it). Default: a store opened at ``path``.
        :param path: directory of the store when ``store`` is None. Default: a new
            temporary directory ``optim-<pid>-*`` under $STRATA_DIR (default
            /var/tmp/strata-<uid>, made mode 0700; see ``strata.default_data_dir``), removed
            by :meth:`close`; one that a killed process left behind (its process gone, its
            store not open) is removed when the next one is made.
        :param tier: where masters and moments live: ``"nvme"`` (default), ``"host"``
            (DRAM), or ``"auto"`` (DRAM while within ``host_budget``, then NVMe).
        :param host_budget: DRAM bytes for host-resident tensors under ``tier="auto"``.
        :param pinned_budget: upper bound of the pipeline's pinned buffers (bytes).
        :param chunk_size: chunk size of a store this optimizer creates (a sub-group of the
            pipeline is one chunk of each stream by default).
        :param key_prefix: prefix of the optimizer's keys in the store. Another optimizer
            open on the same ``store`` under this prefix or one nesting with it (e.g.
            "optim/" and "optim/critic/") makes this one raise
            strata.FailedPreconditionError naming both: pass another ``key_prefix``.
        :param max_grad_norm: > 0 clips gradients by their global L2 norm first, like
            ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm)``; 0 = no clipping.
        :param sub_group_numel, num_buffers, num_threads: pipeline settings, ints >= 0
            (0 = auto; defaults 0, 4, 0).
        :param config: a configuration file (docs/configuration.md; default: the one
            ``store`` was opened with, else ``$STRATA_CONFIG``). Its "optimizer" section
            gives the defaults of ``tier`` (default_placement), ``host_budget``
            (host_budget_bytes), ``pinned_budget`` (pinned_budget_bytes),
            ``sub_group_numel``, ``num_buffers``, ``num_threads``, ``arithmetic``,
            ``overlap_backward`` and ``overlap_bucket_numel``; an argument given here (not
            None) wins. A store this optimizer opens is opened with it (its "io" and
            "store" sections; ``chunk_size`` default: store.chunk_bytes, else 4 MiB).
        :param overlap_backward: start each parameter's update during backward, as soon as
            its gradient is final (strata.torch._overlap: speculative early updates of the
            nvme-tier state, checked at ``step()`` and redone after backward when the step
            is skipped, clipped or anything they used changed; results bit-identical to
            False). Costs one staging copy of the parameters. Use :meth:`accumulating` for
            backward passes that must not step. Default False.
        :param overlap_bucket_numel: with ``overlap_backward``, gradient elements gathered
            before they are handed to strata (int >= 1; default 1: each at once -- strata
            merges what arrives while its previous batch runs).
        :param arithmetic: ``"simd"`` (default; vectorized kernels, each step within 1-2 ulp
            of torch per element) or ``"torch"`` (torch.optim's exact rounding, scalar: for
            bit-identical comparisons with torch.optim.Adam/AdamW).
        :param overwrite: start fresh over an optimizer checkpointed under ``key_prefix`` in
            ``store`` or at ``path``: its record and objects are deleted first (only those:
            other key prefixes' objects, also nested ones, stay). Without it such a
            checkpoint is refused (AlreadyExistsError). Excludes ``resume``.
        :param resume: reopen the optimizer checkpointed under ``key_prefix`` in ``store`` or
            at ``path`` as of its last :meth:`checkpoint` or :meth:`close`, every tier alike
            (see close; ``store`` or ``path`` must then be given; the store is opened
            without create, so a missing store or checkpoint creates nothing). The model's parameters must be
            given in the checkpoint's order and param groups: the same number of groups and
            of parameters (zero-size ones included), each with its checkpointed element
            count. Masters are copied into the parameters, and like
            ``torch.optim.Optimizer.load_state_dict`` the checkpoint's hyperparameters
            (lr, betas, eps, weight_decay, amsgrad, maximize) replace the constructor's in
            ``param_groups`` -- a UserWarning names each constructor value that differs.
            Edit ``param_groups`` afterwards to change them (taken at the next step).
            A checkpoint of an earlier version, whose zero-size parameters' step counts were
            a separate object ``<key_prefix>torch/empty_steps``, resumes with those counts:
            the resume commits them into the optimizer's checkpoint once and deletes the
            object.
        :raises ValueError: a hyperparameter or pipeline setting out of range (as torch;
            naming the argument), an unsupported parameter dtype (naming the parameter index
            and dtype), ``resume`` without ``store``/``path``, ``resume`` with ``overwrite``,
            a param group mixing named and plain parameters, or a checkpoint whose groups,
            parameter count, sizes or parameter names differ from the model's.
        :raises strata.AlreadyExistsError: neither ``resume`` nor ``overwrite``, and the store
            holds an optimizer under ``key_prefix`` (the message says which to pass).
        :raises PermissionError: the default directory belongs to another user.
        :raises strata.NotFoundError: ``resume`` and no store at ``path`` or no checkpoint
            under ``key_prefix``.
        :raises strata.ResourceExhaustedError: the store's file system lacks the space the
            state needs: 2 x (masters + moments: 12 bytes per parameter, 16 with amsgrad,
            each tensor rounded up to 4 KiB) + the pipeline's in-flight chunks + 1 MiB,
            because a step writes new copies beside the last checkpoint's (see
            docs/offload.md, "Disk space"); the message names the directory, the bytes
            needed and the bytes free. Checked before any state is written, here and in
            :meth:`add_param_group`.
        :raises strata.Error: the store cannot be opened (e.g. InvalidArgumentError for
            ``chunk_size=0``). On any error nothing is left behind: a temporary directory
            this constructor made is removed and a store it opened is closed.
        """
        # What close() needs, first: close() must work on a half-constructed object.
        self._opt = None
        self.store = None
        self._owns_store = False
        self._owned_dir: Optional[str] = None
        self._closed = False
        self._ready = False  # set at the end of __init__; add_param_group registers after
        self._names_by_id: Dict[int, str] = {}  # id(param) -> name given with it
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        # defaults < the configuration file's "optimizer" section < the arguments
        if config is None and store is not None:
            config = store.config_file or None
        conf = strata.load_config(config)
        oconf = conf.get("optimizer", {})

        def pick(value: Any, key: str, default: Any) -> Any:
            return value if value is not None else oconf.get(key, default)

        tier = pick(tier, "default_placement", "nvme")
        host_budget = pick(host_budget, "host_budget_bytes", "1GiB")
        pinned_budget = pick(pinned_budget, "pinned_budget_bytes", None)
        sub_group_numel = pick(sub_group_numel, "sub_group_numel", 0)
        num_buffers = pick(num_buffers, "num_buffers", 4)
        num_threads = pick(num_threads, "num_threads", 0)
        arithmetic = pick(arithmetic, "arithmetic", "simd")
        overlap_backward = pick(overlap_backward, "overlap_backward", False)
        overlap_bucket_numel = pick(overlap_bucket_numel, "overlap_bucket_numel", 1)
        if chunk_size is None:
            chunk_size = conf.get("store", {}).get("chunk_bytes", "4MiB")
        #: the pipeline settings in effect (after the configuration file)
        self.settings: Dict[str, Any] = dict(
            tier=tier, host_budget=host_budget, pinned_budget=pinned_budget,
            sub_group_numel=sub_group_numel, num_buffers=num_buffers, num_threads=num_threads,
            arithmetic=arithmetic, overlap_backward=overlap_backward,
            overlap_bucket_numel=overlap_bucket_numel, config=config)
        _hyperparams.check(self._RULE, dict(lr=lr, eps=eps, betas=betas,
                                             weight_decay=weight_decay, amsgrad=amsgrad,
                                             maximize=maximize))
        if tier not in ("nvme", "host", "auto"):
            raise ValueError(f"tier must be 'nvme', 'host' or 'auto', got {tier!r}")
        sub_group_numel = _check_count("sub_group_numel", sub_group_numel)
        num_buffers = _check_count("num_buffers", num_buffers)
        num_threads = _check_count("num_threads", num_threads)
        if not float(max_grad_norm) >= 0.0:
            raise ValueError(f"max_grad_norm must be >= 0 (0 = no clipping), got "
                             f"{max_grad_norm!r}")
        if resume and store is None and path is None:
            raise ValueError("resume=True needs the store or path of the checkpoint")
        if resume and overwrite:
            raise ValueError("resume=True continues from the checkpoint that overwrite=True "
                             "deletes: pass one of them")
        defaults = self._torch_defaults(dict(lr=lr, betas=betas, eps=eps,
                                             weight_decay=weight_decay, amsgrad=amsgrad,
                                             maximize=maximize), torch_kwargs)
        super().__init__(params, defaults)  # checks the parameters' dtypes
        #: torch's per-parameter state, read from strata on access (see _state_view.py)
        self.state = StateView(self)  # type: ignore[assignment]
        for gi, group in enumerate(self.param_groups):
            _hyperparams.check(self._RULE, group, f"param group {gi}: ")
            self._check_torch_flags(group, f"param group {gi}: ")

        self.max_grad_norm = float(max_grad_norm)
        self.tier = tier
        self._key_prefix = key_prefix
        self._resuming = resume  # True while __init__ registers the checkpoint's parameters
        #: resume: parameter index -> handle in the checkpoint (None: a zero-size parameter
        #: that a checkpoint of an earlier version did not hold; see _state_dict.py)
        self._resume_handles: Dict[int, Optional[int]] = {}
        #: resume from such a checkpoint: its zero-size parameters' step counts (index ->
        #: steps, from <key_prefix>torch/empty_steps); None when it has no such object
        self._legacy_empty_steps: Optional[Dict[int, int]] = None
        #: the registered parameters (handle order) and id(param) -> strata handle
        #: (zero-size parameters included: strata holds them with empty objects and counts
        #: their steps, like torch.optim.Adam); see _param_sync.py
        self._table = ParamTable()
        self._params: List[torch.nn.Parameter] = self._table.params
        self._handle: Dict[int, int] = self._table.handle
        #: per group: the hyperparameters strata holds (what _sync_hyperparams compares to)
        self._pushed: List[Dict[str, float]] = []
        #: cumulative bytes moved, by tier and direction
        #: (nvme_* from strata's step statistics; the others: see _staging.Staging)
        self.bytes_moved: Dict[str, int] = dict(nvme_read=0, nvme_written=0, host_grads_read=0,
                                                host_weights_written=0, host_copies=0,
                                                device_to_host=0, host_to_device=0)
        self._staging = Staging(self.bytes_moved)
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
                                           config=config)
            self.store = store
            common = dict(key_prefix=key_prefix, sub_group_numel=sub_group_numel,
                          num_buffers=num_buffers, pinned_budget=pinned_budget,
                          host_budget=host_budget, num_threads=num_threads,
                          arithmetic=arithmetic)
            if resume:
                self._opt = strata.OffloadedOptimizer.resume(store, self._RULE, **common)
                self._legacy_empty_steps = self._read_legacy_empty_steps()
                self._resume_handles = self._check_checkpoint_layout()
            else:
                if overwrite:
                    self._remove_checkpoint()
                try:
                    self._opt = strata.OffloadedOptimizer.create(
                        store, self._RULE, _hyperparams.to_strata(self.param_groups[0]),
                        default_placement=tier, **common)
                except strata.AlreadyExistsError:
                    where = f"the store at {path!r}" if path is not None else "store="
                    raise strata.AlreadyExistsError(
                        f"{type(self).__name__}: {where} already holds an optimizer "
                        f"checkpoint under key_prefix {key_prefix!r}: pass resume=True to "
                        "continue from it, overwrite=True to delete it and start fresh, or "
                        "another key_prefix") from None
            for gi, group in enumerate(self.param_groups):
                self._register_group(gi, group)
            if resume:
                self._finish_legacy_resume()
        except BaseException:
            self.close()
            raise
        self._resuming = False
        self._overlap: Optional[BackwardOverlap] = None
        if overlap_backward and has_offloaded(self._params):
            self.close()
            raise ValueError("overlap_backward=True is not supported for offloaded "
                             "parameters (strata.torch.offload_parameters): their gradients "
                             "go to the store during backward and are stepped in batches")
        if overlap_backward:
            self._overlap = BackwardOverlap(self, _check_count("overlap_bucket_numel",
                                                               overlap_bucket_numel) or 1)
            for p in self._params:
                self._overlap.watch(p)
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
        if isinstance(param_group, dict) and "params" in param_group:
            params, names = param_group["params"], None
            if torch.is_tensor(params):
                params = [params]
            elif not isinstance(params, set):  # torch raises TypeError for sets
                params, names = _names.split_named(list(params), len(self.param_groups))
                base = sum(len(g["params"]) for g in self.param_groups)
                for j, p in enumerate(params):
                    check_param(p, base + j)
            param_group = dict(param_group, params=params)
            if names is not None:
                self._names_by_id.update((id(p), n) for p, n in zip(params, names))
            if self._ready:
                merged = {**self.defaults, **param_group}
                where = f"param group {len(self.param_groups)}: "
                _hyperparams.check(self._RULE, merged, where)
                self._check_torch_flags(merged, where)
                _hyperparams.check_amsgrad(merged, bool(self._pushed[0]["amsgrad"]), where)
        super().add_param_group(param_group)
        if self._ready:  # after __init__: register the new group at once
            self._abort_overlap()
            self._sync_params()

    def _register_group(self, gi: int, group: Dict[str, Any]) -> None:
        if self._resuming:
            _hyperparams.adopt_checkpoint(group, self._opt.hyperparams(gi), type(self).__name__,
                                          gi)
        hp = _hyperparams.to_strata(group)
        if not self._resuming:  # the whole group's disk space first: one clear error
            self._opt.check_disk_space([state_numel(p) for p in group["params"]])
        if gi >= self._opt.num_param_groups():
            got = self._opt.add_param_group(hp)
            assert got == gi, (got, gi)
        self._pushed.append(hp)
        for p in group["params"]:
            if self._resuming:  # checked by _check_checkpoint_layout
                pos = len(self._params)
                h = self._resume_handles[pos]
                if h is None:
                    h = self._add_legacy_empty_param(
                        _names.strata_name(pos, self._names_by_id.get(id(p))), pos, gi)
                copy_master_to_param(self._opt, h, p)
                self._table.add(p, h, gi)
                if type(p) is OffloadedParameter:
                    p._strata_owner.bind_optimizer(p, clip=self.max_grad_norm > 0)
            else:
                self._register_param(gi, p)

    def _register_param(self, gi: int, p: torch.Tensor) -> None:
        """A new parameter of group ``gi``: master from its current value, zero moments."""
        offloaded = type(p) is OffloadedParameter
        value = p._strata_owner.read_state(p) if offloaded else p.detach()
        init = value.reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
        name = _names.strata_name(len(self._params), self._names_by_id.get(id(p)))
        h = self._opt.add_param(name, state_numel(p), init, group=gi, placement=self.tier)
        self._table.add(p, h, gi)
        if offloaded:
            p._strata_owner.bind_optimizer(p, clip=self.max_grad_norm > 0)
        if getattr(self, "_overlap", None) is not None:
            self._overlap.watch(p)

    def _sync_params(self) -> None:
        """Follows ``param_groups`` (see _param_sync.py): checks it before anything is
        registered, then registers groups appended to it directly (filled with the defaults
        as add_param_group does) and new parameters, and takes the current value of every
        parameter changed outside the optimizer as its master.

        :raises ValueError: an edit strata cannot follow, a new group's hyperparameter out
            of range or a new parameter's dtype (naming the group / parameter).
        """
        fresh = self._table.new_params(self.param_groups)
        n_groups = len(self._pushed)
        for gi in range(n_groups, len(self.param_groups)):
            group = self.param_groups[gi]
            if not isinstance(group.get("params"), list):
                group["params"] = ([group["params"]] if torch.is_tensor(group["params"])
                                   else list(group["params"]))
            for k, v in self.defaults.items():
                group.setdefault(k, v)
            where = f"param group {gi}: "
            _hyperparams.check(self._RULE, group, where)
            self._check_torch_flags(group, where)
            _hyperparams.check_amsgrad(group, bool(self._pushed[0]["amsgrad"]), where)
        for gi in range(n_groups, len(self.param_groups)):
            self._register_group(gi, {**self.param_groups[gi], "params": []})
        for gi, p in fresh:
            self._register_param(gi, p)
        self._table.take_changed(self._opt)

    def mark_params_changed(self, params: Optional[Iterable[torch.Tensor]] = None) -> None:
        """Makes the next step (or checkpoint/state_dict) take the current values of
        ``params`` (default: every registered parameter) as their fp32 masters. Only needed
        after in-place edits through ``p.data``, which torch's version counter does not
        see; other changes are noticed without it (see the class doc).

        :raises KeyError: a parameter this optimizer does not hold.
        """
        self._check_open()
        hs = [self._handle[id(p)] for p in (self._params if params is None else params)]
        for h in hs:
            self._table.forget(h)

    def _sync_hyperparams(self) -> None:
        """The registered groups' hyperparameters into strata (groups appended to
        ``param_groups`` directly are registered by _sync_params first)."""
        for gi, group in enumerate(self.param_groups[:len(self._pushed)]):
            hp = _hyperparams.to_strata(group)
            if hp != self._pushed[gi]:
                self._opt.set_hyperparams(gi, hp)
                self._pushed[gi] = hp

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
        Parameters appended to the last group or in groups appended to ``param_groups``
        are registered fresh; betas outside [0, 1) set in a group are stepped as torch
        does. See _param_sync.py and docs/offload.md.

        :raises ValueError: a param_groups edit strata cannot follow (naming the group), a
            new group's hyperparameter out of range, capturable/differentiable/fused set
            True in a group, or a beta2 making ``1 - beta2**t`` negative (torch's "math
            domain error"); nothing is stepped.
        :raises ZeroDivisionError: a beta1 making ``1 - beta1**t`` zero (as torch).
        """
        self._check_open()
        loss = None
        ov = self._overlap
        if ov is not None and ov.open and (closure is not None or not ov.still_valid()):
            ov.abort()  # what the early updates used changed: an ordinary step instead
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if ov is not None:
                ov.abort()  # the closure's backward started updates: redo them here
        if ov is not None and ov.open and (len(self.param_groups) != len(self._pushed)
                                           or self._table.new_params(self.param_groups)
                                           or self.state.pending()
                                           or any(self._table.changed(self._handle[id(p)])
                                                  for p in self._params)):
            ov.abort()  # parameters, param_groups or optimizer.state edited since backward
        overlapped = ov is not None and ov.open
        self._sync_params()
        self._sync_hyperparams()
        self.state.write_back()
        on_gpu = False
        stepped: List[Tuple[torch.nn.Parameter, int]] = []
        for p in ([] if has_offloaded(self._params) else self._params):
            if overlapped and ov.is_started(p):
                continue  # attached by the early update; its weights come from the staging
            h = self._handle[id(p)]
            g = p.grad
            if g is None:
                self._staging.detach(self._opt, h)
                continue
            on_gpu |= self._staging.attach(self._opt, p, h)
            stepped.append((p, h))
        for gi, group in enumerate(self.param_groups):
            self._check_torch_flags(group, f"param group {gi}: ")
            if not _hyperparams.betas_in_range(group):
                _hyperparams.check_step_betas(group, gi, (
                    self._opt.step_count(self._handle[id(p)]) + 1
                    for p in group["params"] if p.grad is not None
                    or (type(p) is OffloadedParameter and p._strata_slot.has_grad)))
        if on_gpu:
            torch.cuda.synchronize()
        if has_offloaded(self._params):
            stats, stepped = offloaded_step(self)
        elif overlapped:
            stats = ov.finish()
        else:
            stats = self._opt.step(max_grad_norm=self.max_grad_norm)
        if ov is not None:
            ov.after_step(stats)
        self.state.invalidate()
        self.last_step = stats
        self.bytes_moved["nvme_read"] += stats["bytes_read"]
        self.bytes_moved["nvme_written"] += stats["bytes_written"]
        if stats["skipped"]:
            return loss
        for p, h in stepped:
            self._staging.copy_back(p, h)
            bump_version(p)  # as torch.optim's in-place update (also where copied above)
            self._table.mark(h)
        if on_gpu:
            torch.cuda.synchronize()
        return loss

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
        """As torch.optim.Optimizer.zero_grad; also forgets the stored gradients of
        offloaded parameters (strata.torch.offload_parameters)."""
        for o in owners(self._params):
            o.zero_grad(set_to_none)
        super().zero_grad(set_to_none)

    # ---- the step overlapped with backward --------------------------------------------------

    def accumulating(self):
        """Context manager for backward passes that must not start updates with
        ``overlap_backward=True`` (gradient accumulation: all but the last micro-batch),
        like DDP's ``no_sync()``. A no-op without overlap_backward."""
        if self._overlap is None:
            return contextlib.nullcontext()
        return self._overlap.suspended()

    def _abort_overlap(self) -> None:
        """Rolls back an overlapped step in flight (before anything that needs the state
        after the last completed step: checkpoint, state dicts, param-group changes,
        close)."""
        if getattr(self, "_overlap", None) is not None and not self._closed:
            self._overlap.abort()

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
        is removed). Then a store the optimizer opened is closed and its temporary
        directory removed. Idempotent; afterwards step/checkpoint/state_dict/
        load_state_dict/add_param_group raise strata.FailedPreconditionError
        ("OffloadAdam is closed").

        :raises strata.ResourceExhaustedError, strata.IoError: the checkpoint failed (e.g.
            disk full); everything is released all the same and the last checkpoint stays
            the resume point.
        :raises strata.FailedPreconditionError: a step failed part-way before (the state
            since the last checkpoint cannot be saved: resume from it), or the store was
            closed before the optimizer."""
        error: Optional[BaseException] = None
        opt = getattr(self, "_opt", None)
        store = getattr(self, "store", None)
        if opt is not None and not getattr(self, "_closed", True):
            # A half-built optimizer, or one whose temporary store is deleted below, is
            # released without a checkpoint.
            keep = getattr(self, "_ready", False) and getattr(self, "_owned_dir", None) is None
            try:
                if keep:
                    self._sync_hyperparams()
                    self._table.take_changed(opt)  # parameters changed outside, as checkpoint()
                    self.state.write_back()
            except Exception as e:  # noqa: BLE001 (raised below, after the release)
                error = e
                keep = False
            if store is not None:
                strata._lifetime.unregister(store, self)
            try:
                opt.close(checkpoint=keep)
            except Exception as e:  # noqa: BLE001
                error = error or e
        self._closed = True
        self._opt = None
        if getattr(self, "_owns_store", False) and store is not None and not store.closed:
            try:
                store.close()
            except Exception as e:  # noqa: BLE001
                error = error or e
        owned, self._owned_dir = getattr(self, "_owned_dir", None), None
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
        if error is not None:
            raise error

    def __del__(self):
        try:
            self.close()
        except Exception as e:  # noqa: BLE001 (garbage collection cannot raise)
            try:
                import warnings
                warnings.warn(f"{type(self).__name__} closed by garbage collection: its last "
                              f"checkpoint failed: {e}", RuntimeWarning)
            except Exception:  # noqa: BLE001 (interpreter shutdown)
                pass


class OffloadAdam(_OffloadAdamBase):
    """torch.optim.Adam (L2 weight decay, default 0) with state in a strata store."""

    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0
    _FLAGS = ADAM_FLAGS


class OffloadAdamW(_OffloadAdamBase):
    """torch.optim.AdamW (decoupled weight decay, default 1e-2) with state in a strata
    store."""

    _RULE = "adamw"
    _DEFAULT_WEIGHT_DECAY = 1e-2
    _FLAGS = ADAMW_FLAGS
    _FLAGS_AFTER_MAXIMIZE = False
