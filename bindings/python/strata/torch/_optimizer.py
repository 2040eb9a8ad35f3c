"""The optimizer classes of strata.torch: OffloadAdam, OffloadAdamW (see the package doc).

Setup, param groups and the step live here; hyperparameters in _hyperparams.py, the moves
of gradients and weights in _staging.py, checkpoints and state dicts in _state_dict.py.
"""

from __future__ import annotations

import operator
import shutil
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

import strata

from .._data_dir import make_temp_dir
from . import _hyperparams, _names
from ._staging import GRAD_DTYPES, Staging, copy_master_to_param
from ._state_dict import StateDictMixin

#: parameter dtypes the optimizers accept (fp32 masters hold them exactly)
_PARAM_DTYPES = GRAD_DTYPES


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


class _OffloadAdamBase(StateDictMixin, torch.optim.Optimizer):
    """The Adam/AdamW optimizers of this package (see the package doc); ``_RULE`` is
    strata's rule ("adam" / "adamw")."""

    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: Optional[float] = None, amsgrad: bool = False, *,
                 maximize: bool = False, store: Optional[strata.Store] = None,
                 path: Optional[str] = None, tier: str = "nvme",
                 host_budget: Union[int, str] = "1GiB",
                 pinned_budget: Optional[Union[int, str]] = None,
                 chunk_size: Union[int, str] = "4MiB", key_prefix: str = "optim/",
                 max_grad_norm: float = 0.0, sub_group_numel: int = 0, num_buffers: int = 4,
                 num_threads: int = 0, resume: bool = False, arithmetic: str = "simd",
                 overwrite: bool = False):
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
        :param key_prefix: prefix of the optimizer's keys in the store.
        :param max_grad_norm: > 0 clips gradients by their global L2 norm first, like
            ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm)``; 0 = no clipping.
        :param sub_group_numel, num_buffers, num_threads: pipeline settings, ints >= 0
            (0 = auto).
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
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)  # checks the parameters' dtypes
        for gi, group in enumerate(self.param_groups):
            _hyperparams.check(self._RULE, group, f"param group {gi}: ")

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
        self._params: List[torch.nn.Parameter] = []
        #: id(param) -> strata handle (zero-size parameters included: strata holds them with
        #: empty objects and counts their steps, like torch.optim.Adam)
        self._handle: Dict[int, int] = {}
        #: per group: the hyperparameters strata holds (what _sync_hyperparams compares to)
        self._pushed: List[Dict[str, float]] = []
        #: cumulative bytes moved, by tier and direction
        self.bytes_moved: Dict[str, int] = dict(nvme_read=0, nvme_written=0, host_grads_read=0,
                                                host_weights_written=0, device_to_host=0,
                                                host_to_device=0)
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
                                           chunk_size=chunk_size, create=not resume)
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
                    if torch.is_tensor(p) and p.dtype not in _PARAM_DTYPES:
                        raise ValueError(
                            f"parameter {base + j} has dtype {p.dtype}; strata offloaded "
                            "optimizers support torch.float32, torch.float16 and "
                            "torch.bfloat16 parameters (fp32 masters would round float64; "
                            "complex is not supported)")
                    if torch.is_tensor(p) and p.is_sparse:
                        raise ValueError(f"parameter {base + j} is sparse; strata offloaded "
                                         "optimizers do not support sparse parameters")
            param_group = dict(param_group, params=params)
            if names is not None:
                self._names_by_id.update((id(p), n) for p, n in zip(params, names))
            if self._ready:
                merged = {**self.defaults, **param_group}
                where = f"param group {len(self.param_groups)}: "
                _hyperparams.check(self._RULE, merged, where)
                _hyperparams.check_amsgrad(merged, bool(self._pushed[0]["amsgrad"]), where)
        super().add_param_group(param_group)
        if self._ready:  # after __init__: register the new group at once
            self._register_group(len(self.param_groups) - 1, self.param_groups[-1])

    def _register_group(self, gi: int, group: Dict[str, Any]) -> None:
        if self._resuming:
            _hyperparams.adopt_checkpoint(group, self._opt.hyperparams(gi), type(self).__name__,
                                          gi)
        hp = _hyperparams.to_strata(group)
        if gi >= self._opt.num_param_groups():
            got = self._opt.add_param_group(hp)
            assert got == gi, (got, gi)
        self._pushed.append(hp)
        for p in group["params"]:
            name = _names.strata_name(len(self._params), self._names_by_id.get(id(p)))
            if self._resuming:  # checked by _check_checkpoint_layout
                h = self._resume_handles[len(self._params)]
                if h is None:
                    h = self._add_legacy_empty_param(name, len(self._params), gi)
                copy_master_to_param(self._opt, h, p)
            else:
                init = p.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
                h = self._opt.add_param(name, p.numel(), init, group=gi,
                                        placement=self.tier)
            self._params.append(p)
            self._handle[id(p)] = h

    def _sync_hyperparams(self) -> None:
        for gi, group in enumerate(self.param_groups):
            hp = _hyperparams.to_strata(group)
            if hp != self._pushed[gi]:
                self._opt.set_hyperparams(gi, hp)
                self._pushed[gi] = hp

    # ---- stepping ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam/AdamW step of every parameter with a gradient (see the module doc).
        Returns the closure's loss (as torch optimizers do); strata's step statistics are in
        ``self.last_step``. A step whose gradients hold inf/NaN is skipped entirely
        (``last_step["skipped"]``), as mixed-precision loss scalers expect."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparams()
        on_gpu = False
        stepped: List[Tuple[torch.nn.Parameter, int]] = []
        for p in self._params:
            h = self._handle[id(p)]
            g = p.grad
            if g is None:
                self._opt.set_grad(h, None)
                self._opt.set_param_copy(h, None)
                continue
            on_gpu |= self._staging.attach(self._opt, p, h)
            stepped.append((p, h))
        if on_gpu:
            torch.cuda.synchronize()
        stats = self._opt.step(max_grad_norm=self.max_grad_norm)
        self.last_step = stats
        self.bytes_moved["nvme_read"] += stats["bytes_read"]
        self.bytes_moved["nvme_written"] += stats["bytes_written"]
        if stats["skipped"]:
            return loss
        for p, h in stepped:
            self._staging.copy_back(self._opt, p, h)
        if on_gpu:
            torch.cuda.synchronize()
        return loss

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


class OffloadAdamW(_OffloadAdamBase):
    """torch.optim.AdamW (decoupled weight decay, default 1e-2) with state in a strata
    store."""

    _RULE = "adamw"
    _DEFAULT_WEIGHT_DECAY = 1e-2
