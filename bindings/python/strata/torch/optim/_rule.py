"""Custom update rules written with torch ops (strata.torch.optim.UpdateRule): the update
of one parameter as a function of torch tensors, run by OffloadOptimizer (optim/_any.py) on
each streamed slice of the offloaded state, or by RuleOptimizer on whole tensors in memory
(the reference it is bit-identical to, as the rule is element-wise).

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

import torch


@dataclass(frozen=True)
class UpdateRule:
    """An optimizer update written with torch ops.

    ``update(param, grad, state, step, group)`` updates one parameter in place:

    - ``param``: fp32 tensor (a 1-D slice of the master when offloaded: sub-group by
      sub-group for the nvme tier, whole for the host tier; the parameter itself in
      RuleOptimizer) -- update it in place (``param.add_(...)``);
    - ``grad``: fp32 tensor of the same shape (do not modify it);
    - ``state``: dict of the rule's ``states`` names -> fp32 tensors of that shape, zeros
      before the first step, updated in place;
    - ``step``: int, the tensor's step number (1 at the first step);
    - ``group``: the param group (``lr`` and the other hyperparameters, as the user and
      schedulers set them).

    It must be element-wise -- element i of the results may depend only on element i of
    param, grad and state and on the scalars -- for the offloaded run to equal the whole
    tensor one bit for bit (reductions over the tensor, such as a norm, would see one slice).

    :param name: recorded in checkpoints (a resume needs the same name and states).
    :param states: names of the state tensors (0..4).
    :param defaults: the hyperparameters and their defaults (``lr`` at least, for
        schedulers).
    """

    name: str
    update: Callable[..., Any]
    states: Sequence[str] = ()
    defaults: Dict[str, Any] = field(default_factory=dict)


def update_rule(name: Optional[str] = None, *, states: Sequence[str] = (),
                defaults: Optional[Dict[str, Any]] = None) -> Callable[[Callable[..., Any]],
                                                                       UpdateRule]:
    """Decorator: ``@update_rule(states=("exp_avg",), defaults=dict(lr=1e-4))`` over
    ``def lion(param, grad, state, step, group)`` gives ``UpdateRule("lion", lion, ...)``
    (the function's name unless ``name`` is given)."""
    def wrap(fn: Callable[..., Any]) -> UpdateRule:
        return UpdateRule(name or fn.__name__, fn, tuple(states), dict(defaults or {}))
    return wrap


class RuleOptimizer(torch.optim.Optimizer):
    """An :class:`UpdateRule` as a plain in-memory torch optimizer (state in
    ``self.state[p]``: ``step`` (int) and the rule's state tensors): the reference an
    OffloadOptimizer over the same rule equals bit for bit, and a way to debug a rule.

    :param rule: the rule. :param params: as torch.optim. :param hyperparams: override the
        rule's defaults (``lr=...``)."""

    def __init__(self, rule: UpdateRule, params: Iterable[Any], **hyperparams: Any):
        unknown = sorted(set(hyperparams) - set(rule.defaults))
        if unknown:
            raise TypeError(f"RuleOptimizer: rule {rule.name!r} has no hyperparameter "
                            f"{unknown[0]!r} (it takes: {', '.join(rule.defaults) or 'none'})")
        self.rule = rule
        super().__init__(params, {**rule.defaults, **hyperparams})

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of the rule on every parameter with a gradient; returns the closure's
        loss (evaluated first, as torch optimizers do)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    for n in self.rule.states:
                        state[n] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                self.rule.update(p, p.grad, {n: state[n] for n in self.rule.states},
                                 state["step"], group)
        return loss
