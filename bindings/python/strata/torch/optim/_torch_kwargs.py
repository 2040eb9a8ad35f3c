"""torch 1.13's Adam/AdamW keyword arguments beyond the hyperparameters strata holds
(``foreach``, ``capturable``, ``differentiable``, ``fused``), and torch's defaults of the
param-group keys that older state dicts lack (``Adam.__setstate__``).

Thread-safety: pure functions of their arguments (one thread: the optimizer's).
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


class TorchFlags:
    """The torch keyword arguments of one optimizer class (composed into it as
    ``_flags``).

    :param who: the class name, for messages (e.g. "OffloadAdamW").
    :param flags: the class's flags with torch's defaults (ADAM_FLAGS or ADAMW_FLAGS).
    :param after_maximize: torch puts the flags after ``maximize`` in ``defaults`` (Adam),
        else ``foreach`` before it (AdamW).
    """

    def __init__(self, who: str, flags: Tuple[Tuple[str, Any], ...], after_maximize: bool):
        self.who = who
        self.flags = flags
        self.after_maximize = after_maximize

    def defaults(self, hp: Dict[str, Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``defaults`` in torch's key order: ``hp`` (lr, betas, eps, weight_decay, amsgrad,
        maximize) and the class's flags from ``kwargs`` (absent: torch's defaults).

        :raises TypeError: a keyword the torch class does not take (as Python would).
        :raises ValueError: capturable/differentiable/fused True, naming the argument.
        """
        known = dict(self.flags)
        for k in kwargs:
            if k not in known:
                raise TypeError(f"{self.who}.__init__() got an unexpected keyword "
                                f"argument '{k}'")
        flags = {k: kwargs.get(k, d) for k, d in self.flags}
        if self.after_maximize:
            defaults = {**hp, **flags}
        else:  # AdamW: ..., amsgrad, foreach, maximize, capturable
            defaults = {k: v for k, v in hp.items() if k != "maximize"}
            defaults["foreach"] = flags.pop("foreach")
            defaults["maximize"] = hp["maximize"]
            defaults.update(flags)
        self.check(defaults, "")
        return defaults

    def check(self, group: Dict[str, Any], where: str) -> None:
        """ValueError when ``group`` (a param group or the defaults) sets capturable,
        differentiable or fused true: ``"<where>capturable=True is not supported: ..."``."""
        for k, why in _WHY.items():
            if group.get(k):
                raise ValueError(f"{where}{k}={group[k]!r} is not supported by "
                                 f"{self.who}: {why} (use {k}=False)")

    def group_defaults(self) -> Dict[str, Any]:
        """torch's ``__setstate__`` defaults of a loaded group's optional keys."""
        return {"amsgrad": False, "maximize": False, **dict(self.flags)}
