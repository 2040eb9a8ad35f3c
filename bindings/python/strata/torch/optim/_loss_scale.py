"""fp16 dynamic loss scaling for strata's optimizers: :class:`DynamicLossScaler`, used as
``torch.cuda.amp.GradScaler`` is (``scaler.scale(loss).backward(); scaler.step(opt);
scaler.update()``), with DeepSpeed's rule and defaults.

What the step does with the scale. The gradients stay scaled in memory (and in an offload's
store); ``scaler.step(opt)`` runs the optimizer's own step with ``1 / scale`` as strata's
``grad_scale``: every gradient is multiplied by it in fp32 inside the update kernels (no
separate unscale pass), and clipping (``max_grad_norm``) takes the norm times ``1 / scale``
(the unscaled norm). The overflow test is the step's own gate (strata's C++
``decide_gate``, optim/_gate.py): a gradient holding an inf or NaN skips the whole step
(parameters, state and step counts unchanged). With power-of-two scales (the default rule
keeps them so from a power-of-two ``init_scale``) ``g * (1 / scale)`` equals ``g / scale``
bit for bit, so a step equals torch.optim's step over gradients divided by the scale.

Over ranks. The decision is the same on every rank: over parameters offloaded with a
communicator (ZeRO-3) the step's gate all-reduces it already; for data-parallel replicas
(each rank its own optimizer) give the scaler ``comm=``: each rank tests its gradients and
the flag is all-reduced (MAX) before any rank steps.

The rule (DeepSpeed, deepspeed/runtime/fp16/loss_scaler.py, ``DynamicLossScaler
.update_scale``, as of deepspeedai/DeepSpeed 18fd4c97; ``hysteresis`` is DeepSpeed's
``delayed_shift``), applied by :meth:`DynamicLossScaler.update` once per iteration:

* overflow: when ``hysteresis == 1`` or the hysteresis left is 1, the scale becomes
  ``max(scale / scale_factor, min_scale)`` (an overflow at ``min_scale`` raises instead,
  with ``raise_error_at_min_scale``), else the hysteresis left drops by one and the scale
  stays; the iteration is the last overflow;
* no overflow: with ``consecutive_hysteresis`` the hysteresis left is refilled; when the
  number of clean iterations before this one since the last overflow (or the start) is a
  positive multiple of ``scale_window``, the scale is multiplied by ``scale_factor`` (and,
  without ``consecutive_hysteresis``, the hysteresis refilled): the first growth comes on
  the ``scale_window + 1``-th clean iteration, then every ``scale_window``.

Thread-safety: none (one training loop drives it, as the optimizers).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch

from .._common import all_finite
from ..offload import is_offloaded, offload_of
from ._any import OffloadOptimizer
from ._optimizer import OffloadedTorchOptimizer

_CONFIG = ("init_scale", "scale_window", "hysteresis", "min_scale", "scale_factor",
           "consecutive_hysteresis", "raise_error_at_min_scale")
_COUNTERS = ("scale", "iteration", "last_overflow_iteration", "hysteresis_left")


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v <= 0:
        raise ValueError(f"DynamicLossScaler: {name} must be a finite number > 0, got {v!r}")
    return float(v)


def _count(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"DynamicLossScaler: {name} must be an integer >= 1, got {v!r}")
    return v


def _flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"DynamicLossScaler: {name} must be a bool, got {v!r}")
    return v


class DynamicLossScaler:
    """Dynamic loss scale for fp16 training with strata's optimizers (the module doc has
    the rule). Usage, as torch's GradScaler::

        scaler = strata.torch.optim.DynamicLossScaler()
        for x, y in data:
            opt.zero_grad()
            scaler.scale(loss_fn(model(x), y)).backward()
            scaler.step(opt)        # unscale fused into the step; skipped on overflow
            scaler.update()         # DeepSpeed's rule

    :param init_scale: the first scale (default 2**16, DeepSpeed's fp16 default
        ``initial_scale_power`` 16); a finite number > 0, not below ``min_scale``.
        Keep it a power of two for bit-exact unscaling.
    :param scale_window: clean iterations between growths (default 1000), integer >= 1.
    :param hysteresis: overflows absorbed before the scale drops (default 2, DeepSpeed's
        ``hysteresis`` / ``delayed_shift``), integer >= 1.
    :param min_scale: the floor of the scale (default 1), finite > 0.
    :param scale_factor: growth and backoff factor (default 2), finite > 1.
    :param consecutive_hysteresis: refill the hysteresis at every clean iteration (default
        False: only when the scale grows).
    :param raise_error_at_min_scale: an overflow that would lower the scale below
        ``min_scale`` when it is already there raises RuntimeError (DeepSpeed's default,
        True), else the scale stays at ``min_scale``.
    :param comm: a ``strata.distributed.Communicator`` over data-parallel replicas, or None:
        the overflow flag is all-reduced (MAX) over its ranks before each step. Not needed
        (and not used) for optimizers over ZeRO-3 offloaded parameters, whose step decides
        over the offload's communicator.
    :param enabled: False: :meth:`scale` returns its argument, :meth:`step` is the
        optimizer's plain step, :meth:`update` does nothing (as GradScaler(enabled=False)).
    :raises ValueError: an argument out of range (naming it); TypeError: a flag that is not
        a bool, a ``comm`` without ``all_reduce``.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, scale_window: int = 1000,
                 hysteresis: int = 2, min_scale: float = 1.0, scale_factor: float = 2.0,
                 consecutive_hysteresis: bool = False, raise_error_at_min_scale: bool = True,
                 comm: Any = None, enabled: bool = True):
        self.init_scale = _positive("init_scale", init_scale)
        self.scale_window = _count("scale_window", scale_window)
        self.hysteresis = _count("hysteresis", hysteresis)
        self.min_scale = _positive("min_scale", min_scale)
        self.scale_factor = _positive("scale_factor", scale_factor)
        if self.scale_factor <= 1.0:
            raise ValueError(f"DynamicLossScaler: scale_factor must be > 1, got {scale_factor!r}")
        if self.init_scale < self.min_scale:
            raise ValueError(f"DynamicLossScaler: init_scale ({init_scale!r}) is below "
                             f"min_scale ({min_scale!r})")
        self.consecutive_hysteresis = _flag("consecutive_hysteresis", consecutive_hysteresis)
        self.raise_error_at_min_scale = _flag("raise_error_at_min_scale",
                                              raise_error_at_min_scale)
        self.enabled = _flag("enabled", enabled)
        if comm is not None and not callable(getattr(comm, "all_reduce", None)):
            raise TypeError(f"DynamicLossScaler: comm must be a strata.distributed."
                            f"Communicator (or None), got {type(comm).__name__}")
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.scale_value = self.init_scale        #: the current loss scale
        self.iteration = 0                        #: update() calls so far (DeepSpeed's cur_iter)
        self.last_overflow_iteration = -1         #: iteration of the last overflow
        self.hysteresis_left = self.hysteresis    #: DeepSpeed's cur_hysteresis
        self.overflows = 0                        #: iterations skipped so far
        #: whether the last update()'s iteration overflowed (its steps were skipped)
        self.last_overflow = False
        self._found: Dict[int, bool] = {}  # id(optimizer) -> overflow, since the last update

    # ---- the iteration ----------------------------------------------------------------------

    def get_scale(self) -> float:
        """The current loss scale (1.0 when disabled)."""
        return self.scale_value if self.enabled else 1.0

    def is_enabled(self) -> bool:
        return self.enabled

    def scale(self, outputs: Any) -> Any:
        """``outputs * scale``: a tensor, or a list/tuple of tensors (same type back). The
        product keeps each tensor's dtype, as DeepSpeed's ``loss * loss_scale``: compute the
        loss in fp32 (an fp16 loss times 2**16 overflows from 1.0 up)."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self.scale_value
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"DynamicLossScaler.scale: takes a tensor or a list/tuple of tensors, "
                        f"got {type(outputs).__name__}")

    def unscale_(self, optimizer: Any) -> None:
        """Refused: strata unscales inside the step (no pass over the gradients), so
        clipping by hand on unscaled gradients is not possible.

        :raises RuntimeError: always, saying to use the optimizer's ``max_grad_norm``
            (clipping inside strata's step, on the unscaled norm)."""
        raise RuntimeError("DynamicLossScaler.unscale_: strata unscales inside the "
                           "optimizer's step (no separate pass over the gradients); to clip, "
                           "create the optimizer with max_grad_norm=..., which clips by the "
                           "unscaled norm as clip_grad_norm_ would")

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """The optimizer's step with every gradient multiplied by ``1 / scale`` inside it,
        or no step when a gradient (on any rank) holds an inf or NaN: nothing changes then
        (parameters, state, step counts). Returns what the optimizer's step returns (None
        when skipped). At most once per optimizer between two :meth:`update` calls.

        :param optimizer: an ``OffloadAdam`` / ``OffloadAdamW`` / ``OffloadOptimizer``.
        :raises TypeError: another optimizer (torch.optim's: use torch's GradScaler).
        :raises ValueError: a closure (as torch's GradScaler: unsupported), an optimizer
            with ``overlap_backward=True`` (its updates start during backward, before the
            scale's overflow test), ``comm`` given for an optimizer over offloaded
            parameters without a communicator.
        :raises RuntimeError: step() twice for one optimizer before update().
        """
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        self._check_optimizer(optimizer)
        if args or "closure" in kwargs:
            raise ValueError("DynamicLossScaler.step: a closure is not supported (as torch's "
                             "GradScaler): run forward and scale(loss).backward() first")
        if id(optimizer) in self._found:
            raise RuntimeError("DynamicLossScaler.step: step() was already called for this "
                               "optimizer since the last update()")
        if self._replica_overflow(optimizer):
            self._found[id(optimizer)] = True
            return None
        optimizer._grad_scale = 1.0 / self.scale_value
        try:
            out = optimizer.step()
        finally:
            del optimizer._grad_scale  # the class's None again
        self._found[id(optimizer)] = bool(optimizer.last_step["skipped"])
        return out

    def update(self, new_scale: Optional[float] = None) -> None:
        """Ends the iteration: DeepSpeed's rule (module doc) with "overflow" = some
        optimizer stepped since the last update skipped; or, with ``new_scale``, sets the
        scale to it (counters unchanged, as GradScaler.update(new_scale)).

        :raises RuntimeError: no step() since the last update(); an overflow at
            ``min_scale`` with ``raise_error_at_min_scale`` (nothing changed).
        :raises ValueError: ``new_scale`` not a finite number > 0.
        """
        if not self.enabled:
            return
        if new_scale is not None:
            self.scale_value = _positive("new_scale", new_scale)
            self._found = {}
            return
        if not self._found:
            raise RuntimeError("DynamicLossScaler.update: no step() since the last update()")
        overflow = any(self._found.values())
        if overflow:
            if self.hysteresis == 1 or self.hysteresis_left == 1:
                if self.scale_value == self.min_scale and self.raise_error_at_min_scale:
                    raise RuntimeError(
                        f"DynamicLossScaler: gradients overflow at the minimum loss scale "
                        f"(min_scale={self.min_scale}); cannot lower it further "
                        "(raise_error_at_min_scale=True)")
                self.scale_value = max(self.scale_value / self.scale_factor, self.min_scale)
            else:
                self.hysteresis_left -= 1
            self.last_overflow_iteration = self.iteration
            self.overflows += 1
        else:
            if self.consecutive_hysteresis:
                self.hysteresis_left = self.hysteresis
            clean_before = self.iteration - self.last_overflow_iteration - 1
            if clean_before > 0 and clean_before % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.hysteresis_left = self.hysteresis
                self.scale_value *= self.scale_factor
        self.iteration += 1
        self.last_overflow = overflow
        self._found = {}

    # ---- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The settings and counters (plain Python numbers): what load_state_dict takes."""
        out: Dict[str, Any] = {k: getattr(self, k) for k in _CONFIG}
        out.update(scale=self.scale_value, iteration=self.iteration,
                   last_overflow_iteration=self.last_overflow_iteration,
                   hysteresis_left=self.hysteresis_left, overflows=self.overflows,
                   enabled=self.enabled)
        return out

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` (settings and counters).

        :raises KeyError: an entry missing (naming it); ValueError: a value out of range."""
        missing = [k for k in _CONFIG + _COUNTERS if k not in state]
        if missing:
            raise KeyError(f"DynamicLossScaler.load_state_dict: the state has no {missing[0]!r}")
        fresh = DynamicLossScaler(**{k: state[k] for k in _CONFIG},
                                  enabled=state.get("enabled", True))
        if _positive("scale", state["scale"]) < fresh.min_scale or \
                not 1 <= int(state["hysteresis_left"]) <= fresh.hysteresis:
            raise ValueError("DynamicLossScaler.load_state_dict: scale below min_scale or "
                             "hysteresis_left out of [1, hysteresis]")
        for k in _CONFIG + ("enabled",):
            setattr(self, k, getattr(fresh, k))
        self.scale_value = float(state["scale"])
        self.iteration = int(state["iteration"])
        self.last_overflow_iteration = int(state["last_overflow_iteration"])
        self.hysteresis_left = int(state["hysteresis_left"])
        self.overflows = int(state.get("overflows", 0))
        self._found = {}

    # ---- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _check_optimizer(optimizer: Any) -> None:
        if not isinstance(optimizer, (OffloadedTorchOptimizer, OffloadOptimizer)):
            raise TypeError(f"DynamicLossScaler.step: takes strata's optimizers (OffloadAdam, "
                            f"OffloadAdamW, OffloadOptimizer), got {type(optimizer).__name__} "
                            "(for torch.optim's, use torch's GradScaler)")
        if getattr(optimizer, "settings", {}).get("overlap_backward"):
            raise ValueError("DynamicLossScaler.step: the optimizer was created with "
                             "overlap_backward=True, whose updates start during backward, "
                             "before the overflow test of the scaled gradients; create it "
                             "with overlap_backward=False to use loss scaling")

    @staticmethod
    def _params(optimizer: Any) -> List[torch.Tensor]:
        return [p for g in optimizer.param_groups for p in g["params"]]

    def _replica_overflow(self, optimizer: Any) -> bool:
        """With ``comm`` (data-parallel replicas): whether a gradient on some rank holds an
        inf or NaN (one all-reduce). False without ``comm`` or for optimizers over ZeRO-3
        offloaded parameters (whose step decides over their communicator)."""
        if self.comm is None:
            return False
        params = self._params(optimizer)
        offloaded = [p for p in params if is_offloaded(p)]
        if any(offload_of(p).comm is not None for p in offloaded):
            return False  # the step's gate all-reduces over the offload's communicator
        if offloaded:
            raise ValueError("DynamicLossScaler.step: comm= with parameters offloaded without "
                             "a communicator is not supported (their gradients are in the "
                             "store); offload them with offload_parameters(comm=...) (ZeRO-3)")
        local = any(p.grad is not None and not all_finite(p.grad.detach()) for p in params)
        flag = torch.tensor([1.0 if local else 0.0])
        self.comm.all_reduce(flag, op="max")
        return bool(flag.item() != 0.0)
