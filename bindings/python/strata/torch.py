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
import os
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import torch

import strata as _strata

__all__ = ["OffloadAdam", "OffloadAdamW"]

_GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)


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
        :param lr, betas, eps, weight_decay, amsgrad, maximize: as torch.optim.Adam/AdamW
            (weight_decay default: 0 for Adam, 1e-2 for AdamW).
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
            ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm)``.
        :param sub_group_numel, num_buffers, num_threads: pipeline settings (0 = auto).
        :param arithmetic: ``"simd"`` (default; vectorized kernels, each step within 1-2 ulp
            of torch per element) or ``"torch"`` (torch.optim's exact rounding, scalar: for
            bit-identical comparisons with torch.optim.Adam/AdamW).
        :param resume: reopen the optimizer checkpointed under ``key_prefix`` in the store
            (masters are copied into the model's parameters).
        :raises ValueError: a hyperparameter out of range (as torch).
        """
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if tier not in ("nvme", "host", "auto"):
            raise ValueError(f"tier must be 'nvme', 'host' or 'auto', got {tier!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        self._opt = None
        super().__init__(params, defaults)

        self.max_grad_norm = float(max_grad_norm)
        self.tier = tier
        self._owned_dir: Optional[str] = None
        self._owns_store = store is None
        if store is None:
            if path is None:
                base = os.environ.get("STRATA_DIR", "/var/tmp/strata")
                os.makedirs(base, exist_ok=True)
                path = self._owned_dir = tempfile.mkdtemp(prefix="optim-", dir=base)
            store = _strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                       chunk_size=chunk_size)
        self.store = store
        common = dict(key_prefix=key_prefix, sub_group_numel=sub_group_numel,
                      num_buffers=num_buffers, pinned_budget=pinned_budget,
                      host_budget=host_budget, num_threads=num_threads,
                      arithmetic=arithmetic)
        self._key_prefix = key_prefix
        #: parameter index -> checkpointed step count of a zero-size parameter (resume only)
        self._saved_empty_steps: Dict[int, int] = {}
        if resume:
            self._opt = _strata.OffloadedOptimizer.resume(store, self._RULE, **common)
            self._saved_empty_steps = self._read_empty_steps()
        else:
            self._opt = _strata.OffloadedOptimizer.create(
                store, self._RULE, self._hyperparams(self.param_groups[0]),
                default_placement=tier, **common)
        self._resume = resume
        self._params: List[torch.nn.Parameter] = []
        #: id(param) -> strata handle; None for zero-size parameters, which strata does not
        #: hold (an object of 0 bytes has nothing to update) but which stay in param_groups
        #: and get torch's (empty) state entries, like torch.optim.Adam.
        self._handle: Dict[int, Optional[int]] = {}
        #: id(param) -> steps taken by a zero-size parameter (torch counts them too)
        self._empty_steps: Dict[int, int] = {}
        self._pushed: List[Dict[str, float]] = []
        self._pinned: Dict[Tuple[int, str], torch.Tensor] = {}
        #: cumulative bytes moved, by tier and direction
        self.bytes_moved: Dict[str, int] = dict(nvme_read=0, nvme_written=0, host_grads_read=0,
                                                host_weights_written=0, device_to_host=0,
                                                host_to_device=0)
        #: stats of the last step (dict from strata: bytes_read, bytes_written, grad_norm, ...)
        self.last_step: Dict[str, Any] = {}
        for gi, group in enumerate(self.param_groups):
            self._register_group(gi, group)

    # ---- setup ---------------------------------------------------------------------------

    @staticmethod
    def _hyperparams(group: Dict[str, Any]) -> Dict[str, float]:
        b1, b2 = group["betas"]
        return {"lr": float(group["lr"]), "beta1": float(b1), "beta2": float(b2),
                "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"]),
                "amsgrad": float(bool(group["amsgrad"])),
                "maximize": float(bool(group.get("maximize", False)))}

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if self._opt is not None:  # after __init__: register the new group at once
            self._register_group(len(self.param_groups) - 1, self.param_groups[-1])

    def _register_group(self, gi: int, group: Dict[str, Any]) -> None:
        hp = self._hyperparams(group)
        if gi >= self._opt.num_param_groups():
            got = self._opt.add_param_group(hp)
            assert got == gi, (got, gi)
        self._pushed.append(hp)
        for p in group["params"]:
            if p.is_sparse:
                raise ValueError("strata offloaded optimizers do not support sparse parameters")
            name = f"p{len(self._params)}"
            if p.numel() == 0:
                self._empty_steps[id(p)] = self._saved_empty_steps.pop(len(self._params), 0)
                self._params.append(p)
                self._handle[id(p)] = None
                continue
            if self._resume:
                if len(self._params) in self._saved_empty_steps:
                    raise ValueError(f"checkpointed parameter {name} has 0 elements, the "
                                     f"model's has {p.numel()}")
                h = self._opt.find_param(name)
                info = self._opt.param_info(h)
                if info["numel"] != p.numel():
                    raise ValueError(f"checkpointed parameter {name} has {info['numel']} "
                                     f"elements, the model's has {p.numel()}")
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
        model's current parameters."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(self.param_groups, groups):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        saved_ids = list(itertools.chain.from_iterable(g["params"] for g in groups))
        for ours, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    ours[k] = v
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        for sid, p in zip(saved_ids, self._params):
            h = self._handle[id(p)]
            st = state_dict["state"].get(sid)
            if h is None:  # zero-size: only the step count
                step = (st or {}).get("step", 0)
                self._empty_steps[id(p)] = int(step.item() if torch.is_tensor(step) else step)
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
                else:  # e.g. max_exp_avg_sq when the saved run had amsgrad off
                    self._opt.write_state(h, k, np.zeros(p.numel(), dtype=np.float32))
            step = st["step"]
            self._opt.set_step_count(h, int(step.item() if torch.is_tensor(step) else step))
        self._sync_hyperparams()

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Releases the optimizer (no checkpoint), closes a store it opened, removes its
        temporary directory."""
        if self._opt is not None:
            self._opt._o.close()
            self._opt = None
        if self._owns_store and self.store is not None and not self.store.closed:
            self.store.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

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
