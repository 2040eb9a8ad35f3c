"""Parameter names of strata.torch's optimizers: ``(name, parameter)`` pairs (what
``model.named_parameters()`` yields, as torch.optim accepts them from torch 2.6 on) are
recorded in the store, so that ``strata store ls`` shows ``optim/p/p3:blocks.0.attn.weight/
exp_avg`` instead of ``optim/p/p3/exp_avg``.

strata's parameter name of model parameter ``i`` (in registration order) is ``p<i>`` without
a name and ``p<i>:<name>`` with one (characters other than printable ASCII, whitespace and
``%`` written as ``%XX``); a resume finds parameter ``i`` by its ``p<i>`` part, so
checkpoints with and without names resume alike.

Thread-safety: pure functions.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import torch

INDEX = re.compile(r"p(\d+)(?::(.*))?\Z", re.S)


def split_named(params: List[Any], group_index: int) -> Tuple[List[Any], Optional[List[str]]]:
    """``params`` of one param group without names, and their names: None when the group
    gives plain parameters, else one name per parameter.

    :param params: a list of parameters, or of ``(str, parameter)`` pairs.
    :raises ValueError: a group mixing pairs and plain parameters, or a pair whose name is
        not a str (naming the group index).
    """
    named = [isinstance(p, tuple) and len(p) == 2 and torch.is_tensor(p[1]) for p in params]
    if not any(named):
        return params, None
    if not all(named):
        raise ValueError(f"param group {group_index} mixes (name, parameter) pairs with plain "
                         "parameters; give all of its parameters one way")
    for name, _ in params:
        if not isinstance(name, str):
            raise ValueError(f"param group {group_index}: a parameter name must be a str, got "
                             f"{type(name).__name__} {name!r}")
    return [p for _, p in params], [n for n, _ in params]


def escape(name: str) -> str:
    return "".join(c if "!" <= c <= "~" and c != "%" else
                   "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def strata_name(index: int, name: Optional[str]) -> str:
    """strata's name of model parameter ``index`` (see the module doc)."""
    return f"p{index}" if not name else f"p{index}:{escape(name)}"


def checkpoint_handles(opt: Any, names: Dict[int, Optional[str]], key_prefix: str
                       ) -> Dict[int, int]:
    """resume: model parameter index -> its handle in the checkpoint ``opt``
    (strata.OffloadedOptimizer), for the indices the checkpoint holds.

    :param names: model parameter index -> the name it was given (None: none).
    :raises ValueError: the checkpoint and the model both name parameter ``i`` and the names
        differ (the model's parameters in another order than the checkpoint's), naming both.
    """
    handles: Dict[int, int] = {}
    for h in range(opt.num_params()):
        m = INDEX.match(opt.param_info(h)["name"])
        if not m:
            continue
        i, recorded = int(m.group(1)), m.group(2)
        handles[i] = h
        given = names.get(i)
        if recorded is not None and given and recorded != escape(given):
            raise ValueError(f"the checkpoint under '{key_prefix}' holds parameter {i} as "
                             f"'{recorded}', the model gives '{given}': give the parameters "
                             "in the checkpoint's order")
    return handles
