"""torch 1.13's Adam/AdamW keyword arguments beyond the hyperparameters strata holds
(``foreach``, ``capturable``, ``differentiable``, ``fused``), and torch's defaults of the
param-group keys that older state dicts lack (``Adam.__setstate__``).

Thread-safety: pure functions of their arguments (methods of the optimizer, one thread).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

#: torch.optim.Adam's keyword arguments after the hyperparameters, with their defaults
ADAM_FLAGS: Tuple[Tuple[str, Any], ...] = (("foreach", None), ("capturable", False),
                                           ("differentiable", False), ("fused", False))
#: torch.optim.AdamW's (torch 1.13's AdamW has no differentiable / fused)
ADAMW_FLAGS: Tuple[Tuple[str, Any], ...] = (("foreach", None), ("capturable", False))

#: why each flag cannot be True for an offloaded step
_WHY = {
    "capturable": "the offloaded step runs on the CPU and cannot be captured in a CUDA graph",
    "differentiable": "autograd cannot differentiate through the offloaded step",
    "fused": "the offloaded step runs on the CPU; there is no fused CUDA kernel to use",
}


class TorchKwargsMixin:
    """``_torch_defaults`` / ``_check_torch_flags`` / ``__setstate__`` of the optimizers.
    ``_FLAGS`` is the class's flags (ADAM_FLAGS or ADAMW_FLAGS); ``_FLAGS_AFTER_MAXIMIZE``
    whether torch puts them after ``maximize`` in ``defaults`` (Adam) or ``foreach``
    before it (AdamW)."""

    _FLAGS: Tuple[Tuple[str, Any], ...] = ADAM_FLAGS
    _FLAGS_AFTER_MAXIMIZE = True

    def _torch_defaults(self, hp: Dict[str, Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``defaults`` in torch's key order: ``hp`` (lr, betas, eps, weight_decay, amsgrad,
        maximize) and the class's flags from ``kwargs`` (absent: torch's defaults).

        :raises TypeError: a keyword the torch class does not take (as Python would).
        :raises ValueError: capturable/differentiable/fused True, naming the argument.
        """
        known = dict(self._FLAGS)
        for k in kwargs:
            if k not in known:
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword "
                                f"argument '{k}'")
        flags = {k: kwargs.get(k, d) for k, d in self._FLAGS}
        if self._FLAGS_AFTER_MAXIMIZE:
            defaults = {**hp, **flags}
        else:  # AdamW: ..., amsgrad, foreach, maximize, capturable
            defaults = {k: v for k, v in hp.items() if k != "maximize"}
            defaults["foreach"] = flags.pop("foreach")
            defaults["maximize"] = hp["maximize"]
            defaults.update(flags)
        self._check_torch_flags(defaults, "")
        return defaults

    def _check_torch_flags(self, group: Dict[str, Any], where: str) -> None:
        """ValueError when ``group`` (a param group or the defaults) sets capturable,
        differentiable or fused true: ``"<where>capturable=True is not supported: ..."``."""
        for k, why in _WHY.items():
            if group.get(k):
                raise ValueError(f"{where}{k}={group[k]!r} is not supported by "
                                 f"{type(self).__name__}: {why} (use {k}=False)")

    def _group_defaults(self) -> Dict[str, Any]:
        """torch's ``__setstate__`` defaults of a loaded group's optional keys."""
        return {"amsgrad": False, "maximize": False, **dict(self._FLAGS)}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """As torch.optim.Adam/AdamW.__setstate__: groups lacking an optional key take
        torch's default (amsgrad, maximize, foreach, capturable, ...)."""
        super().__setstate__(state)  # type: ignore[misc]
        for group in self.param_groups:  # type: ignore[attr-defined]
            for k, v in self._group_defaults().items():
                group.setdefault(k, v)
