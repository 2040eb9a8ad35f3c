"""OffloadAdam and OffloadAdamW (see the package doc, strata/torch/optim/__init__.py): the
constructor -- torch.optim.Adam/AdamW's arguments, strata's settings, their checks -- over
the offloaded torch optimizer of optim/_optimizer.py.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple, Union

import torch

import strata  # noqa: F401 (in the signature's annotations)

from . import _hyperparams, _settings
from ._grad_accum import check_option
from ._optimizer import OffloadedTorchOptimizer
from ._torch_kwargs import ADAM_FLAGS, ADAMW_FLAGS, TorchFlags


class _OffloadAdamBase(OffloadedTorchOptimizer):
    """The Adam/AdamW optimizers of this package (see the package doc); ``_RULE`` is
    strata's rule ("adam" / "adamw")."""

    _RULE = "adam"
    _DEFAULT_WEIGHT_DECAY = 0.0
    _FLAGS: Tuple[Tuple[str, Any], ...] = ADAM_FLAGS
    _FLAGS_AFTER_MAXIMIZE = True

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
                 grad_accumulation_dtype: Any = None, state_dtype: Any = None,
                 **torch_kwargs: Any):
        """
        :param params: iterable of parameters or of param-group dicts (as torch.optim), or
            of ``(name, parameter)`` pairs such as ``model.named_parameters()`` (also as a
            group's ``"params"``): the names are recorded in the store's keys
            (``<key_prefix>p/p<i>:<name>/...``, shown by ``strata store ls``; see
            optim/_names.py) and checked at a resume. Parameters must be fp32, fp16 or bf16 (CPU
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
            its gradient is final (optim/_overlap.py: speculative early updates of the
            nvme-tier state, checked at ``step()`` and redone after backward when the step
            is skipped, clipped or anything they used changed; results bit-identical to
            False). Costs one staging copy of the parameters. Use :meth:`accumulating` for
            backward passes that must not step. Default False.
        :param overlap_bucket_numel: with ``overlap_backward``, gradient elements gathered
            before they are handed to strata (int >= 1; default 1: each at once -- strata
            merges what arrives while its previous batch runs).
        :param grad_accumulation_dtype: how the micro-batch gradients of fp16/bf16
            parameters add up between steps (optim/_grad_accum.py in memory,
            offload/_grad_sum.py for parameters offloaded by ``offload_parameters``;
            docs/guide-optimizers.md, "Mixed precision: gradient accumulation"):
            ``torch.float32`` (the default) sums them in an fp32 buffer per parameter (4
            bytes per element, from the first backward after the optimizer holds it to
            ``zero_grad``; for an offloaded parameter its gradient object in the store) that
            the step takes, ``p.grad`` showing the sum rounded to the parameter's dtype;
            ``"param"`` keeps torch's accumulation in the parameter's dtype (tiled offloaded
            parameters always do). fp32 parameters are not affected. Default with
            ``overlap_backward``: ``"param"`` (torch.float32 is refused with it: ValueError).
        :param state_dtype: element type of the moments (exp_avg, exp_avg_sq,
            max_exp_avg_sq) in the store: ``torch.float32`` (default, also None / "fp32") or
            ``torch.bfloat16`` (also "bf16"): bf16 moments, as DeepSpeed's
            ``bf16_optimizer_states``. Each step reads them as bf16, updates in fp32 (the
            same kernels), and rounds them back to bf16 (nearest even): exactly fp32 Adam
            whose moments are rounded to bf16 after every step; 8 instead of 12 bytes per
            parameter read and written per step (docs/offload.md, "bf16 moments"). Masters
            stay fp32. ``state[p]`` and ``state_dict()`` show the moments as fp32 tensors
            holding the bf16 values (the dtype torch's Adam state has for fp32 parameters,
            so state dicts stay interchangeable with torch.optim); a ``load_state_dict`` or
            an edit of ``state[p]`` rounds them to bf16. Recorded in the checkpoint: a
            ``resume`` passes the same (strata.FailedPreconditionError otherwise).
            Another dtype: ValueError. None: the configuration file's
            ``optimizer.state_dtype`` ("fp32" | "bf16"), else fp32; ``settings["state_dtype"]``
            shows the one in effect.
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
            without create, so a missing store or checkpoint creates nothing). The model's
            parameters must be given in the checkpoint's order and param groups: the same
            number of groups and of parameters (zero-size ones included), each with its
            checkpointed element count; after ``param_groups`` edits (a checkpoint with a
            layout record, optim/_layout.py) parameters given with names are found by name
            in any order, the others by position, and a parameter the checkpoint cannot
            give is refused naming it. Masters are copied into the parameters, and like
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
        :raises strata.DiskFullError: (an OSError, errno ENOSPC, and a
            strata.ResourceExhaustedError) the store's file system lacks the space the
            state needs: 2 x (masters + moments: 12 bytes per parameter, 16 with amsgrad,
            each tensor rounded up to 4 KiB) + the pipeline's in-flight chunks + 1 MiB,
            because a step writes new copies beside the last checkpoint's (see
            docs/offload.md, "Disk space"); the message names the directory, the bytes
            needed and the bytes free. Checked before any state is written, here and in
            :meth:`add_param_group` (a refused group is not added). A full ``nvme_budget``
            is a plain strata.ResourceExhaustedError.
        :raises strata.Error: the store cannot be opened (e.g. InvalidArgumentError for
            ``chunk_size=0``). On any error nothing is left behind: a temporary directory
            this constructor made is removed and a store it opened is closed.
        """
        if weight_decay is None:
            weight_decay = self._DEFAULT_WEIGHT_DECAY
        flags = TorchFlags(type(self).__name__, self._FLAGS, self._FLAGS_AFTER_MAXIMIZE)
        given = dict(tier=tier, host_budget=host_budget, pinned_budget=pinned_budget,
                     sub_group_numel=sub_group_numel, num_buffers=num_buffers,
                     num_threads=num_threads, arithmetic=arithmetic,
                     overlap_backward=overlap_backward,
                     overlap_bucket_numel=overlap_bucket_numel, chunk_size=chunk_size,
                     state_dtype=state_dtype)
        settings = _settings.resolve(config, store, given)
        settings["state_dtype"] = _state_dtype(settings["state_dtype"], type(self).__name__)
        chunk_size = settings.pop("chunk_size")
        _hyperparams.check(self._RULE, dict(lr=lr, eps=eps, betas=betas,
                                             weight_decay=weight_decay, amsgrad=amsgrad,
                                             maximize=maximize))
        counts = _settings.check(settings)
        grad_accumulation = check_option(grad_accumulation_dtype,
                                         bool(settings["overlap_backward"]))
        if not float(max_grad_norm) >= 0.0:
            raise ValueError(f"max_grad_norm must be >= 0 (0 = no clipping), got "
                             f"{max_grad_norm!r}")
        if resume and store is None and path is None:
            raise ValueError("resume=True needs the store or path of the checkpoint")
        if resume and overwrite:
            raise ValueError("resume=True continues from the checkpoint that overwrite=True "
                             "deletes: pass one of them")
        defaults = flags.defaults(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       amsgrad=amsgrad, maximize=maximize), torch_kwargs)
        super().__init__(params, defaults, rule=self._RULE, flags=flags, settings=settings,
                         counts=counts, chunk_size=chunk_size, store=store, path=path,
                         key_prefix=key_prefix, max_grad_norm=float(max_grad_norm),
                         resume=resume, overwrite=overwrite,
                         grad_accumulation=grad_accumulation,
                         state_dtype=settings["state_dtype"])


def _state_dtype(state_dtype: Any, who: str) -> str:
    """strata's name ("fp32" / "bf16") of OffloadAdam(W)'s ``state_dtype`` argument.

    :raises ValueError: anything but None, torch.float32, torch.bfloat16, "fp32", "float32",
        "bf16" or "bfloat16" (the message names the value)."""
    if state_dtype is None or state_dtype in (torch.float32, "fp32", "float32"):
        return "fp32"
    if state_dtype in (torch.bfloat16, "bf16", "bfloat16"):
        return "bf16"
    raise ValueError(f"{who}: state_dtype must be torch.float32 or torch.bfloat16 (the "
                     f"moments' dtype in the store), got {state_dtype!r}")


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
