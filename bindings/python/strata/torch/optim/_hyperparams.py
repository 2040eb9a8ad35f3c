"""The hyperparameters of strata.torch's optimizers: torch's param_group keys <-> strata's
names, and their range checks, which are strata's own rule's (the C++ ``make_adam`` checks,
reached through ``strata._strata.hyperparams_refusal``) raised with torch.optim.Adam's
ValueError messages.

Thread-safety: pure functions (``adopt_checkpoint`` warns).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Iterable

from ... import _strata as _core

#: torch param_group keys that strata holds, in torch's order
HP_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
#: torch.optim.Adam's name of each hyperparameter in its "Invalid <name>: <value>" messages
_TORCH_NAMES = {"lr": "learning rate", "eps": "epsilon value",
                "beta1": "beta parameter at index 0", "beta2": "beta parameter at index 1",
                "weight_decay": "weight_decay value"}


def _named(group: Dict[str, Any], with_betas: bool = True) -> Dict[str, Any]:
    """strata's names -> the group's values as given (``beta1``/``beta2`` from ``betas``)."""
    hp = {"lr": group["lr"], "eps": group["eps"], "weight_decay": group["weight_decay"],
          "amsgrad": bool(group["amsgrad"]), "maximize": bool(group.get("maximize", False))}
    if with_betas:
        hp["beta1"], hp["beta2"] = group["betas"]
    return hp


def betas_in_range(group: Dict[str, Any]) -> bool:
    """Both betas in [0, 1): torch.optim's check at construction."""
    return all(0.0 <= float(b) < 1.0 for b in group["betas"])


def to_strata(group: Dict[str, Any]) -> Dict[str, float]:
    """A torch param group's hyperparameters under strata's names, as floats:
    lr, beta1, beta2, eps, weight_decay, amsgrad and maximize (1.0 / 0.0; maximize absent =
    False), and any_betas (1.0 when a beta is outside [0, 1): strata's rule then takes any
    finite betas, as torch.optim's step does). ``betas`` must be a pair."""
    hp = {k: float(v) for k, v in _named(group).items()}
    hp["any_betas"] = 0.0 if betas_in_range(group) else 1.0
    return hp


def check_step_betas(group: Dict[str, Any], gi: int, steps: Iterable[int]) -> None:
    """Before a step of group ``gi`` whose betas are outside [0, 1): where torch.optim's
    step raises for them, raise the same error naming the group and value. ``steps``: the
    step number t (1-based) each parameter of the group is about to take.

    :raises ZeroDivisionError: ``1 - beta1 ** t == 0`` (torch: ``lr / bias_correction1``).
    :raises ValueError: ``1 - beta2 ** t < 0`` (torch: ``math.sqrt`` math domain error).
    """
    beta1, beta2 = (float(b) for b in group["betas"])
    for t in set(steps):
        if 1 - beta1 ** t == 0:
            raise ZeroDivisionError(
                f"param group {gi}: betas[0] = {beta1!r} makes the bias correction "
                f"1 - beta1**{t} zero at step {t} (torch.optim.Adam divides lr by it and "
                "raises ZeroDivisionError too)")
        if 1 - beta2 ** t < 0 or math.isnan(1 - beta2 ** t):
            raise ValueError(
                f"param group {gi}: betas[1] = {beta2!r} makes 1 - beta2**{t} negative at "
                f"step {t}: its square root is undefined (torch.optim.Adam raises 'math "
                "domain error' too)")


def from_strata(hp: Dict[str, float]) -> Dict[str, Any]:
    """strata's hyperparameters (to_strata's names) as torch param_group values."""
    return {"lr": hp["lr"], "betas": (hp["beta1"], hp["beta2"]), "eps": hp["eps"],
            "weight_decay": hp["weight_decay"], "amsgrad": bool(hp["amsgrad"]),
            "maximize": bool(hp["maximize"])}


def check(rule: str, group: Dict[str, Any], where: str = "", any_betas: bool = False) -> None:
    """Checks one group's hyperparameters with strata's rule ``rule`` ("adam" / "adamw"),
    whose checks are torch.optim.Adam's: lr, eps, each beta (in [0, 1)), weight_decay.

    :param where: prefix of the message, e.g. ``"param group 1: "``.
    :param any_betas: accept any finite betas (what torch's step takes; a loaded state
        dict's groups are not range-checked by torch either).
    :raises ValueError: torch's message for the first value out of range, e.g.
        ``"<where>Invalid learning rate: -1.0"`` (the value as given), or
        ``"<where>betas must be a pair, got ..."`` (after lr and eps, as torch checks).
    :raises strata.InvalidArgumentError: a value that is not a number (e.g. a str).
    """
    betas = group["betas"]
    pair = len(betas) == 2
    named = _named(group, with_betas=pair)
    if any_betas:
        named["any_betas"] = True
    refusal = _core.hyperparams_refusal(rule, named)
    key = refusal[0] if refusal is not None else None
    if not pair and key not in ("lr", "eps"):
        raise ValueError(f"{where}betas must be a pair, got {betas!r}")
    if refusal is None:
        return
    if key in _TORCH_NAMES:
        given = betas[key == "beta2"] if key in ("beta1", "beta2") else group[key]
        raise ValueError(f"{where}Invalid {_TORCH_NAMES[key]}: {given}")
    raise ValueError(where + refusal[1])


def check_amsgrad(group: Dict[str, Any], made_with: bool, where: str = "") -> None:
    """ValueError unless ``group["amsgrad"]`` is ``made_with``: strata's state streams (two,
    or three with amsgrad) are fixed when the optimizer is created."""
    if bool(group["amsgrad"]) != made_with:
        raise ValueError(f"{where}amsgrad={bool(group['amsgrad'])}, but this optimizer's state "
                         f"streams were made with amsgrad={made_with}")


def adopt_checkpoint(group: Dict[str, Any], checkpointed: Dict[str, float], who: str,
                     gi: int) -> None:
    """resume: param group ``gi`` takes the checkpoint's hyperparameters (strata's names),
    with a UserWarning naming each constructor value that differs (``who``: the class name).
    Call it from the method that registers the group (the warning points 4 frames up)."""
    adopted = from_strata(checkpointed)
    given = to_strata(group)
    diffs = []
    for k in HP_KEYS:
        if k == "betas":
            same = (given["beta1"], given["beta2"]) == adopted["betas"]
        else:
            same = given[k] == float(adopted[k])
        if not same:
            diffs.append(f"{k}={adopted[k]!r} (constructor: {group[k]!r})")
    group.update(adopted)
    if diffs:
        warnings.warn(f"{who}(resume=True): param group {gi} takes the checkpoint's "
                      + ", ".join(diffs) + "; set param_groups to change them", UserWarning,
                      stacklevel=4)
