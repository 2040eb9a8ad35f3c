"""``optimizer.state`` of OffloadOptimizer (optim/_any.py): a read-only mapping parameter ->
its state as the torch.optim class keeps it, read from the store at each access.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch


class AnyStateView(Mapping):
    """``opt.state[p]``: a new dict of p's state (the class's scalars, e.g. ``step``, and
    its state tensors, fp32 CPU copies shaped like p) read from the store; ``{}`` for a
    parameter of the optimizer without state yet (as torch's defaultdict), KeyError for
    another tensor. Copies: editing them changes nothing (``load_state_dict`` does).

    :param entry: p -> its state dict, or None when p has none; raises KeyError for a
        tensor the optimizer does not hold.
    :param with_state: the parameters that have state, in param_groups order."""

    def __init__(self, entry: Callable[[torch.Tensor], Optional[Dict[str, Any]]],
                 with_state: Callable[[], List[torch.Tensor]]):
        self._entry = entry
        self._with_state = with_state

    def __getitem__(self, p: torch.Tensor) -> Dict[str, Any]:
        e = self._entry(p)
        return {} if e is None else e

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._with_state())

    def __len__(self) -> int:
        return len(self._with_state())

    def __contains__(self, p: object) -> bool:
        return any(q is p for q in self._with_state())
