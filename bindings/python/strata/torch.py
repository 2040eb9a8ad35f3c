"""PyTorch optimizers whose fp32 master weights and moments live in a strata store.

``OffloadAdam`` and ``OffloadAdamW`` are ``torch.optim.Optimizer`` subclasses with the
arguments and semantics of ``torch.optim.Adam`` / ``torch.optim.AdamW`` (torch 1.13:
bias correction, amsgrad, maximize, L2 vs decoupled weight decay). Each step:

1. the gradients are attached without copies when they are contiguous CPU tensors
   (fp32/fp16/bf16; other dtypes are converted to fp32); CUDA gradients are first copied
   into pinned host buffers (one per parameter, allocated once);
2. strata's offloaded step runs on the CPU (GIL released): for state in the nvme tier the
   masters and moments stream through a few pinned buffers, reads of the next sub-group and
   writes of the previous one overlapping the update (see optimizer/offload.hpp);
3. the updated weights go back into the model: fp32 CPU parameters receive the fp32
   masters, fp16/bf16 CPU parameters receive the rounded copy written by the kernel itself
   (round to nearest even), CUDA parameters via pinned host buffers.

The model's own parameters are never the master copy: with fp16/bf16 parameters the fp32
masters keep full precision across steps (mixed-precision training).

Example::

    opt = strata.torch.OffloadAdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                    path="/nvme/run1", tier="nvme", max_grad_norm=1.0)
    loss.backward(); opt.step(); opt.zero_grad()
    opt.checkpoint()                    # durable, in place

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import torch

import strata as _strata

__all__ = ["OffloadAdam", "OffloadAdamW"]

_GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
#: parameter dtypes the optimizers accept (fp32 masters hold them exactly)
_PARAM_DTYPES = _GRAD_DTYPES
#: torch param_group keys and their strata hyperparameter names
_HP_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")


def _check_hyperparams(group: Dict[str, Any], where: str = "") -> None:
    """torch.optim.Adam's range checks (and strata's, optimizer/src/optimizers.cpp) of one
    group's hyperparameters; ValueError naming the value (prefixed by ``where``)."""
    lr, eps, wd, betas = group["lr"], group["eps"], group["weight_decay"], group["betas"]
    if not 0.0 <= lr:
        raise ValueError(f"{where}Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"{where}Invalid epsilon value: {eps}")
    if len(betas) != 2:
        raise ValueError(f"{where}betas must be a pair, got {betas!r}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= wd:
        raise ValueError(f"{where}Invalid weight_decay value: {wd}")


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


def _numel(t: Any) -> int:
    return t.numel() if torch.is_tensor(t) else int(np.asarray(t).size)


def _step_value(step: Any) -> float:
    return float(step.item() if torch.is_tensor(step) else step)


class _OffloadAdamBase(torch.optim.Optimizer):
    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: Optional[float] = None, amsgrad: bool = False, *,
                 maximize: bool = False, store: Optional[_strata.Store] = None,
                 path: Optional[str] = None, tier: str = "nvme",
                 host_budget: Union[int, str] = "1GiB",
                 pinned_budget: Optional[Union[int, str]] = None,
                 chunk_size: Union[int, str] = "4MiB", key_prefix: str = "optim/",
                 max_grad_norm: float = 0.0, sub_group_numel: int = 0, num_buffers: int = 4,
                 num_threads: int = 0, resume: bool = False, arithmetic: str = "simd"):
        """
        :param params: iterable of parameters or of param-group dicts (as torch.optim).
            Parameters must be fp32, fp16 or bf16 (CPU or CUDA); float64 (which fp32 masters
            would silently round) and complex parameters are refused.
        :param lr, betas, eps, weight_decay, amsgrad, maximize: as torch.optim.Adam/AdamW
            (weight_decay default: 0 for Adam, 1e-2 for AdamW). With ``resume=True`` the
            checkpoint's values win (see ``resume``).
        :param store: a :class:`strata.Store` to keep the state in (the optimizer does not
            close it). Default: a store opened at ``path``.
        :param path: directory of the store when ``store`` is None. Default: a new
            temporary directory under $STRATA_DIR (default /var/tmp/strata), removed by
            :meth:`close`.
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
        :param resume: reopen the optimizer checkpointed under ``key_prefix`` in ``store`` or
            at ``path`` (which must then be given; the store is opened without create, so a
            missing store or checkpoint creates nothing). The model's parameters must be
            given in the checkpoint's order and param groups: the same number of groups and
            of parameters (zero-size ones included), each with its checkpointed element
            count. Masters are copied into the parameters, and like
            ``torch.optim.Optimizer.load_state_dict`` the checkpoint's hyperparameters
            (lr, betas, eps, weight_decay, amsgrad, maximize) replace the constructor's in
            ``param_groups`` -- a UserWarning names each constructor value that differs.
            Edit ``param_groups`` afterwards to change them (taken at the next step).
        :raises ValueError: a hyperparameter or pipeline setting out of range (as torch;
            naming the argument), an unsupported parameter dtype (naming the parameter index
            and dtype), ``resume`` without ``store``/``path``, or a checkpoint whose groups,
            parameter count or sizes differ from the model's.
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
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        _check_hyperparams(dict(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay))
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
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)  # checks the parameters' dtypes
        for gi, group in enumerate(self.param_groups):
            _check_hyperparams(group, f"param group {gi}: ")

        self.max_grad_norm = float(max_grad_norm)
        self.tier = tier
        self._key_prefix = key_prefix
        #: parameter index -> checkpointed step count of a zero-size parameter (resume only)
        self._saved_empty_steps: Dict[int, int] = {}
        self._resuming = resume  # True while __init__ registers the checkpoint's parameters
        self._params: List[torch.nn.Parameter] = []
        #: id(param) -> strata handle; None for zero-size parameters, which strata does not
        #: hold (an object of 0 bytes has nothing to update) but which stay in param_groups
        #: and get torch's (empty) state entries, like torch.optim.Adam.
        self._handle: Dict[int, Optional[int]] = {}
        #: id(param) -> steps taken by a zero-size parameter (torch counts them too)
        self._empty_steps: Dict[int, int] = {}
        #: per group: the hyperparameters strata holds (what _sync_hyperparams compares to)
        self._pushed: List[Dict[str, float]] = []
        self._pinned: Dict[Tuple[int, str], torch.Tensor] = {}
        #: cumulative bytes moved, by tier and direction
        self.bytes_moved: Dict[str, int] = dict(nvme_read=0, nvme_written=0, host_grads_read=0,
                                                host_weights_written=0, device_to_host=0,
                                                host_to_device=0)
        #: stats of the last step (dict from strata: bytes_read, bytes_written, grad_norm, ...)
        self.last_step: Dict[str, Any] = {}
        try:
            if store is None:
                self._owns_store = True
                if path is None:
                    base = os.environ.get("STRATA_DIR", "/var/tmp/strata")
                    os.makedirs(base, exist_ok=True)
                    path = self._owned_dir = tempfile.mkdtemp(prefix="optim-", dir=base)
                # resume: never create a store (a missing one is NotFound, nothing is made)
                store = _strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                           chunk_size=chunk_size, create=not resume)
            self.store = store
            common = dict(key_prefix=key_prefix, sub_group_numel=sub_group_numel,
                          num_buffers=num_buffers, pinned_budget=pinned_budget,
                          host_budget=host_budget, num_threads=num_threads,
                          arithmetic=arithmetic)
            if resume:
                self._opt = _strata.OffloadedOptimizer.resume(store, self._RULE, **common)
                self._saved_empty_steps = self._read_empty_steps()
                self._check_checkpoint_layout()
            else:
                self._opt = _strata.OffloadedOptimizer.create(
                    store, self._RULE, self._hyperparams(self.param_groups[0]),
                    default_placement=tier, **common)
            for gi, group in enumerate(self.param_groups):
                self._register_group(gi, group)
        except BaseException:
            self.close()
            raise
        self._resuming = False
        self._ready = True

    # ---- setup ---------------------------------------------------------------------------

    @staticmethod
    def _hyperparams(group: Dict[str, Any]) -> Dict[str, float]:
        b1, b2 = group["betas"]
        return {"lr": float(group["lr"]), "beta1": float(b1), "beta2": float(b2),
                "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"]),
                "amsgrad": float(bool(group["amsgrad"])),
                "maximize": float(bool(group.get("maximize", False)))}

    def _check_open(self) -> None:
        if self._closed:
            raise _strata.FailedPreconditionError(f"{type(self).__name__} is closed")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As torch.optim.Optimizer.add_param_group; the group's parameters must be fp32,
        fp16 or bf16 and its hyperparameters in range (ValueError naming the parameter index
        and dtype, or the value, before anything is added). Added after construction (also
        after a resume), its parameters start fresh: masters from their current values."""
        if self._ready:
            self._check_open()
        if isinstance(param_group, dict) and "params" in param_group:
            params = param_group["params"]
            if torch.is_tensor(params):
                params = [params]
            elif not isinstance(params, set):  # torch raises TypeError for sets
                params = list(params)
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
            if self._ready:
                merged = {**self.defaults, **param_group}
                where = f"param group {len(self.param_groups)}: "
                _check_hyperparams(merged, where)
                if bool(merged["amsgrad"]) != bool(self._pushed[0]["amsgrad"]):
                    raise ValueError(f"{where}amsgrad={bool(merged['amsgrad'])}, but this "
                                     f"optimizer's state streams were made with amsgrad="
                                     f"{bool(self._pushed[0]['amsgrad'])}")
        super().add_param_group(param_group)
        if self._ready:  # after __init__: register the new group at once
            self._register_group(len(self.param_groups) - 1, self.param_groups[-1])

    def _check_checkpoint_layout(self) -> None:
        """resume: the model's groups and parameter count must be the checkpoint's."""
        n_groups = self._opt.num_param_groups()
        if len(self.param_groups) != n_groups:
            raise ValueError(
                f"the checkpoint under '{self._key_prefix}' has {n_groups} param group(s), "
                f"the optimizer was given {len(self.param_groups)}; give the parameters in "
                "the checkpoint's groups")
        params = [p for g in self.param_groups for p in g["params"]]
        has_empty_rows = self._empty_steps_key in self.store
        if has_empty_rows:
            held, given = self._opt.num_params() + len(self._saved_empty_steps), len(params)
        else:  # a checkpoint without zero-size counts: compare the non-empty parameters
            held, given = self._opt.num_params(), sum(1 for p in params if p.numel() > 0)
        if held != given:
            raise ValueError(f"the checkpoint under '{self._key_prefix}' holds {held} "
                             f"parameters, the model gives {given}")
        # every parameter before any master is copied into the model
        i = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name, i = f"p{i}", i + 1
                if p.numel() == 0:
                    if has_empty_rows and i - 1 not in self._saved_empty_steps:
                        n = self._opt.param_info(self._opt.find_param(name))["numel"]
                        raise ValueError(f"checkpointed parameter {name} has {n} elements, "
                                         "the model's has 0")
                    continue
                if int(name[1:]) in self._saved_empty_steps:
                    raise ValueError(f"checkpointed parameter {name} has 0 elements, the "
                                     f"model's has {p.numel()}")
                info = self._opt.param_info(self._opt.find_param(name))
                if info["numel"] != p.numel():
                    raise ValueError(f"checkpointed parameter {name} has {info['numel']} "
                                     f"elements, the model's has {p.numel()}")
                if info["group"] != gi:
                    raise ValueError(f"checkpointed parameter {name} is in param group "
                                     f"{info['group']}, the model gives it in group {gi}")

    def _adopt_checkpoint_hyperparams(self, gi: int, group: Dict[str, Any]) -> None:
        """resume: group ``gi`` takes strata's (the checkpoint's) hyperparameters, warning
        about each constructor value that differs."""
        ck = self._opt.hyperparams(gi)
        adopted = {"lr": ck["lr"], "betas": (ck["beta1"], ck["beta2"]), "eps": ck["eps"],
                   "weight_decay": ck["weight_decay"], "amsgrad": bool(ck["amsgrad"]),
                   "maximize": bool(ck["maximize"])}
        given = self._hyperparams(group)
        diffs = []
        for k in _HP_KEYS:
            if k == "betas":
                same = (given["beta1"], given["beta2"]) == adopted["betas"]
            else:
                same = given[k] == float(adopted[k])
            if not same:
                diffs.append(f"{k}={adopted[k]!r} (constructor: {group[k]!r})")
        group.update(adopted)
        if diffs:
            warnings.warn(f"{type(self).__name__}(resume=True): param group {gi} takes the "
                          f"checkpoint's " + ", ".join(diffs) + "; set param_groups to "
                          "change them", UserWarning, stacklevel=4)

    def _register_group(self, gi: int, group: Dict[str, Any]) -> None:
        if self._resuming:
            self._adopt_checkpoint_hyperparams(gi, group)
        hp = self._hyperparams(group)
        if gi >= self._opt.num_param_groups():
            got = self._opt.add_param_group(hp)
            assert got == gi, (got, gi)
        self._pushed.append(hp)
        for p in group["params"]:
            name = f"p{len(self._params)}"
            if p.numel() == 0:
                self._empty_steps[id(p)] = self._saved_empty_steps.pop(len(self._params), 0)
                self._params.append(p)
                self._handle[id(p)] = None
                continue
            if self._resuming:  # checked by _check_checkpoint_layout
                h = self._opt.find_param(name)
                self._copy_master_to_param(h, p)
            else:
                init = p.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
                h = self._opt.add_param(name, p.numel(), init, group=gi,
                                        placement=self.tier)
            self._params.append(p)
            self._handle[id(p)] = h

    def _pinned_buf(self, h: int, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._pinned.get((h, kind))
        if buf is None or buf.dtype != dtype or buf.numel() != numel:
            buf = torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())
            self._pinned[(h, kind)] = buf
        return buf

    def _sync_hyperparams(self) -> None:
        for gi, group in enumerate(self.param_groups):
            hp = self._hyperparams(group)
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
        stepped_empty: List[torch.nn.Parameter] = []
        for p in self._params:
            h = self._handle[id(p)]
            g = p.grad
            if h is None:  # zero-size: nothing to update, but torch counts the step
                if g is not None:
                    stepped_empty.append(p)
                continue
            if g is None:
                self._opt.set_grad(h, None)
                self._opt.set_param_copy(h, None)
                continue
            if g.is_sparse:
                raise RuntimeError("strata offloaded optimizers do not support sparse gradients")
            if g.is_cuda:
                host = self._pinned_buf(h, "grad", g.numel(), g.dtype if g.dtype in _GRAD_DTYPES
                                        else torch.float32)
                host.copy_(g.reshape(-1), non_blocking=True)
                self.bytes_moved["device_to_host"] += host.numel() * host.element_size()
                on_gpu = True
            else:
                host = g.reshape(-1)
                if host.dtype not in _GRAD_DTYPES:
                    host = host.float()
                if not host.is_contiguous():
                    host = host.contiguous()
            self._opt.set_grad(h, host)
            self.bytes_moved["host_grads_read"] += host.numel() * host.element_size()
            # fp16/bf16 CPU parameters receive the rounded copy from the kernel directly.
            if not p.is_cuda and p.dtype in _HALF_DTYPES and p.is_contiguous():
                self._opt.set_param_copy(h, p.detach().view(-1))
            elif p.is_cuda and p.dtype in _HALF_DTYPES:
                self._opt.set_param_copy(h, self._pinned_buf(h, "copy", p.numel(), p.dtype))
            else:
                self._opt.set_param_copy(h, None)
            stepped.append((p, h))
        if on_gpu:
            torch.cuda.synchronize()
        stats = self._opt.step(max_grad_norm=self.max_grad_norm)
        self.last_step = stats
        self.bytes_moved["nvme_read"] += stats["bytes_read"]
        self.bytes_moved["nvme_written"] += stats["bytes_written"]
        if stats["skipped"]:
            return loss
        for p in stepped_empty:
            self._empty_steps[id(p)] += 1
        for p, h in stepped:
            self._copy_back(p, h)
        if on_gpu:
            torch.cuda.synchronize()
        return loss

    def _copy_back(self, p: torch.nn.Parameter, h: int) -> None:
        nbytes = p.numel() * p.element_size()
        if p.is_cuda:
            if p.dtype in _HALF_DTYPES:
                buf = self._pinned[(h, "copy")]
            else:
                buf = self._pinned_buf(h, "master", p.numel(), torch.float32)
                self._opt.read_param(h, buf)
            p.data.view(-1).copy_(buf.to(p.dtype) if buf.dtype != p.dtype else buf,
                                  non_blocking=True)
            self.bytes_moved["host_to_device"] += nbytes
            return
        self.bytes_moved["host_weights_written"] += nbytes
        if p.dtype in _HALF_DTYPES and p.is_contiguous():
            return  # written by the kernel (set_param_copy)
        if p.dtype == torch.float32 and p.is_contiguous():
            self._opt.read_param(h, p.detach().view(-1))  # straight into the parameter
            return
        p.data.copy_(torch.from_numpy(self._opt.read_param(h)).view(p.shape))

    def _copy_master_to_param(self, h: int, p: torch.nn.Parameter) -> None:
        master = torch.from_numpy(self._opt.read_param(h)).view(p.shape)
        with torch.no_grad():
            p.copy_(master)

    # ---- durability, state dicts ---------------------------------------------------------

    @property
    def _empty_steps_key(self) -> str:
        return self._key_prefix + "torch/empty_steps"

    def checkpoint(self) -> None:
        """Makes the state after the last step durable in place (one store flush); reopen
        with ``resume=True`` and the same store/path and key_prefix.

        The step counts of zero-size parameters (which strata does not hold) are written
        first, as the int64 object ``<key_prefix>torch/empty_steps`` of shape (n, 2): rows
        (parameter index, step count), n = number of zero-size parameters (may be 0)."""
        self._check_open()
        rows = [(i, self._empty_steps[id(p)]) for i, p in enumerate(self._params)
                if self._handle[id(p)] is None]
        self.store.put(self._empty_steps_key, np.array(rows, dtype=np.int64).reshape(-1, 2),
                       overwrite=True)
        self._opt.checkpoint()

    def _read_empty_steps(self) -> Dict[int, int]:
        """{parameter index: step count} of the zero-size parameters of the checkpoint ({}
        for a checkpoint written before these counts were saved)."""
        if self._empty_steps_key not in self.store:
            return {}
        rows = self.store.get(self._empty_steps_key)
        if rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != 2:
            raise ValueError(f"checkpoint object '{self._empty_steps_key}' has dtype "
                             f"{rows.dtype} shape {rows.shape}, expected int64 (n, 2)")
        return {int(i): int(n) for i, n in rows}

    def state_dict(self) -> Dict[str, Any]:
        """torch.optim.Adam's format: ``state[i]`` has ``step`` (a float tensor),
        ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) as fp32 CPU
        tensors shaped like parameter i; for fp16/bf16 parameters also ``master_param``
        (the fp32 master). It loads into torch.optim.Adam/AdamW and back."""
        self._check_open()
        state: Dict[int, Dict[str, Any]] = {}
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        for i, p in enumerate(self._params):
            h = self._handle[id(p)]
            step = self._empty_steps[id(p)] if h is None else self._opt.step_count(h)
            if step == 0:
                continue
            st: Dict[str, Any] = {"step": torch.tensor(float(step))}
            for k, name in enumerate(names):
                st[name] = (torch.zeros(p.shape, dtype=torch.float32) if h is None else
                            torch.from_numpy(self._opt.read_state(h, k)).view(p.shape))
            if p.dtype != torch.float32:
                st["master_param"] = (torch.zeros(p.shape, dtype=torch.float32) if h is None
                                      else torch.from_numpy(self._opt.read_param(h))
                                      .view(p.shape))
            state[i] = st
        groups = []
        index = 0
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(g)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch.optim.Adam/AdamW (same groups and
        parameter sizes). Masters come from ``master_param`` when present, else from the
        model's current parameters; a parameter without a state entry restarts (zero
        moments, step 0). The saved groups' hyperparameters replace ``param_groups``'.

        Atomic with respect to validation: everything is checked before anything is
        written, so a refused state dict leaves the optimizer exactly as it was.

        :raises ValueError: a different number of groups or of parameters in a group; a
            hyperparameter out of range (naming the group); ``amsgrad`` other than this
            optimizer's (strata's state streams are fixed at creation); a state entry
            without ``step`` or with a step that is not an integer >= 0; a state tensor
            (exp_avg, exp_avg_sq, max_exp_avg_sq, master_param) whose element count is not
            the parameter's (naming the parameter index, the state and both sizes).
        :raises strata.FailedPreconditionError: the optimizer is closed.
        """
        self._check_open()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(self.param_groups, groups):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        # ---- validate everything first (nothing is written before this block ends) ----
        new_groups = []
        for gi, (ours, saved) in enumerate(zip(self.param_groups, groups)):
            merged = {k: v for k, v in ours.items() if k != "params"}
            merged.update({k: v for k, v in saved.items() if k != "params"})
            where = f"loaded param group {gi}: "
            _check_hyperparams(merged, where)
            if bool(merged["amsgrad"]) != bool(self._pushed[gi]["amsgrad"]):
                raise ValueError(f"{where}amsgrad={bool(merged['amsgrad'])}, but this "
                                 f"optimizer's state streams were made with amsgrad="
                                 f"{bool(self._pushed[gi]['amsgrad'])}")
            new_groups.append(merged)
        saved_ids = list(itertools.chain.from_iterable(g["params"] for g in groups))
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        for sid, p in zip(saved_ids, self._params):
            st = state_dict["state"].get(sid)
            if st is None:
                continue
            if "step" not in st:
                raise ValueError(f"loaded state of parameter {sid} has no 'step'")
            step = _step_value(st["step"])
            if not (math.isfinite(step) and step >= 0 and step == int(step)):
                raise ValueError(f"loaded state of parameter {sid}: step {step} is not an "
                                 "integer >= 0")
            for name in names + ["master_param"]:
                if name in st and _numel(st[name]) != p.numel():
                    raise ValueError(f"loaded state of parameter {sid}: '{name}' has "
                                     f"{_numel(st[name])} elements, the parameter has "
                                     f"{p.numel()}")
        # ---- hyperparameters (undone if strata refuses one), then the tensors ----
        old_groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for ours, merged in zip(self.param_groups, new_groups):
            ours.update(merged)
        try:
            self._sync_hyperparams()
        except BaseException:
            for ours, old in zip(self.param_groups, old_groups):
                for k in list(ours):
                    if k != "params" and k not in old:
                        del ours[k]
                ours.update(old)
            self._sync_hyperparams()
            raise
        for sid, p in zip(saved_ids, self._params):
            h = self._handle[id(p)]
            st = state_dict["state"].get(sid)
            if h is None:  # zero-size: only the step count
                self._empty_steps[id(p)] = int(_step_value((st or {}).get("step", 0)))
                continue
            master = (st or {}).get("master_param", p.detach())
            self._opt.write_param(h, _as_f32_numpy(master))
            if st is None:
                zeros = np.zeros(p.numel(), dtype=np.float32)
                for k in range(len(names)):
                    self._opt.write_state(h, k, zeros)
                self._opt.set_step_count(h, 0)
                continue
            for k, name in enumerate(names):
                if name in st:
                    self._opt.write_state(h, k, _as_f32_numpy(st[name]))
                else:  # absent (e.g. a torch state dict before its first step)
                    self._opt.write_state(h, k, np.zeros(p.numel(), dtype=np.float32))
            self._opt.set_step_count(h, int(_step_value(st["step"])))

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Releases the optimizer (no checkpoint), closes a store it opened, removes its
        temporary directory. Idempotent, and safe on an object whose constructor failed.
        Afterwards step/checkpoint/state_dict/load_state_dict/add_param_group raise
        strata.FailedPreconditionError ("OffloadAdam is closed")."""
        self._closed = True
        opt, self._opt = getattr(self, "_opt", None), None
        if opt is not None:
            opt._o.close()
        store = getattr(self, "store", None)
        if getattr(self, "_owns_store", False) and store is not None and not store.closed:
            store.close()
        owned, self._owned_dir = getattr(self, "_owned_dir", None), None
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _as_f32_numpy(t: Any) -> np.ndarray:
    if torch.is_tensor(t):
        return t.detach().to(device="cpu", dtype=torch.float32).reshape(-1).contiguous().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).reshape(-1))


class OffloadAdam(_OffloadAdamBase):
    """torch.optim.Adam (L2 weight decay, default 0) with state in a strata store."""

    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0


class OffloadAdamW(_OffloadAdamBase):
    """torch.optim.AdamW (decoupled weight decay, default 1e-2) with state in a strata
    store."""

    _RULE = "adamw"
    _DEFAULT_WEIGHT_DECAY = 1e-2
