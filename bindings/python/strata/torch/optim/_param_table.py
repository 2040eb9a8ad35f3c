"""The parameters of strata.torch's optimizers as ``param_groups`` shows them: which strata
handle each has, edits of ``param_groups`` made after construction, and parameters changed
outside the optimizer.

Rules (documented in the package doc and docs/offload.md):

* Each step (and each checkpoint() / state_dict()) walks ``param_groups``. Parameters
  appended after the registered ones -- to the last group's ``params`` list, or in groups
  appended to ``param_groups`` directly -- are registered fresh, as ``add_param_group``
  would (masters from their current values, zero moments, step 0). Any other edit (a
  registered parameter removed, replaced, reordered or moved to another group, a parameter
  listed twice, a group removed) raises ValueError naming the group before anything is
  stepped: strata never steps what ``param_groups`` does not show.
* A parameter whose value changed since the optimizer last wrote it (``model.load_state_dict``,
  ``p.copy_``, ``p.clamp_()`` under ``torch.no_grad()``, ``p.data = t``) is noticed by its
  version counter (``p._version``) and storage address (``p.data_ptr()``); its current value
  (fp16/bf16: widened exactly to fp32) becomes the master before the step, as torch.optim
  always steps from the parameter's current value. Nothing is copied for an unchanged
  parameter. In-place edits through ``p.data`` (``p.data.clamp_()``) bypass the version
  counter, as they bypass autograd: they are not seen (do them on ``p`` under
  ``torch.no_grad()``, or call ``mark_params_changed``).

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .._common import GRAD_DTYPES
from ..offload import is_offloaded, offload_of
from ._exchange import as_f32_numpy


def check_param(p: Any, index: int) -> None:
    """ValueError naming parameter ``index`` when ``p`` is a tensor strata cannot hold:
    a dtype other than fp32/fp16/bf16 (fp32 masters would round float64; complex is not
    supported) or a sparse tensor."""
    if torch.is_tensor(p) and p.dtype not in GRAD_DTYPES:
        raise ValueError(f"parameter {index} has dtype {p.dtype}; strata offloaded "
                         "optimizers support torch.float32, torch.float16 and "
                         "torch.bfloat16 parameters (fp32 masters would round float64; "
                         "complex is not supported)")
    if torch.is_tensor(p) and p.is_sparse:
        raise ValueError(f"parameter {index} is sparse; strata offloaded optimizers do not "
                         "support sparse parameters")


def state_numel(p: torch.Tensor) -> int:
    """Elements the optimizer holds of ``p``: an offloaded parameter partitioned over ranks
    (ZeRO-3) only this rank's slice, any other parameter all."""
    o = offload_of(p)
    return p.numel() if o is None else o.state_numel(p)


def offloads(params: List[torch.Tensor]) -> List[Any]:
    """The ParameterOffload handles of the offloaded ones of ``params`` (each once, in order
    of first appearance)."""
    seen: Dict[int, Any] = {}
    for p in params:
        o = offload_of(p)
        if o is not None:
            seen.setdefault(id(o), o)
    return list(seen.values())


def _mark(p: torch.Tensor) -> Tuple[Any, int]:
    o = offload_of(p)
    if o is not None:  # an offloaded parameter: its stored value's change count
        return ("offloaded", o.version(p))
    return (p._version, p.data_ptr())


class ParamTable:
    """The registered parameters in registration order (their positions in the flattened
    ``param_groups``) and their strata handles (equal to the positions except for a resumed
    checkpoint of an earlier version, whose zero-size parameters were added last)."""

    def __init__(self) -> None:
        #: the strata.OffloadedOptimizer holding the handles (None until it is created and
        #: after the optimizer closed)
        self.core: Any = None
        #: by position: the parameter, its param group
        self.params: List[torch.Tensor] = []
        self.groups: List[int] = []
        #: id(param) -> strata handle
        self.handle: Dict[int, int] = {}
        #: strata handle -> position
        self._pos: Dict[int, int] = {}
        #: by handle: (version, data_ptr) of its parameter when the optimizer last wrote or
        #: read it (None: take it at the next sync)
        self._marks: Dict[int, Optional[Tuple[int, int]]] = {}

    def add(self, p: torch.Tensor, h: int, group: int) -> None:
        """Registers ``p`` (the next position) as strata handle ``h`` of ``group``."""
        self._pos[h] = len(self.params)
        self.params.append(p)
        self.groups.append(group)
        self.handle[id(p)] = h
        self._marks[h] = _mark(p)

    def state_names(self) -> List[str]:
        """The names of ``core``'s state streams (torch's: exp_avg, exp_avg_sq[,
        max_exp_avg_sq]), in stream order."""
        return [self.core.state_name(k) for k in range(self.core.num_states())]

    def param_of(self, h: int) -> torch.Tensor:
        """The parameter of strata handle ``h``."""
        return self.params[self._pos[h]]

    def mark(self, h: int) -> None:
        """The master of handle ``h`` and its parameter agree now (after a copy either way)."""
        self._marks[h] = _mark(self.param_of(h))

    def forget(self, h: int) -> None:
        """Handle ``h``'s parameter is to be taken as the master at the next sync."""
        self._marks[h] = None

    def changed(self, h: int) -> bool:
        """The parameter of ``h`` was changed outside the optimizer since the last mark."""
        return self._marks[h] != _mark(self.param_of(h))

    def take_changed(self) -> int:
        """Every changed parameter's current value (widened to fp32) into its master in
        ``core``; returns how many were taken."""
        opt = self.core
        n = 0
        for o in offloads(self.params):
            o.write_back()  # edits of materialized offloaded parameters into their objects
        for p in self.params:
            h = self.handle[id(p)]
            if self.changed(h):
                value = offload_of(p).read_state(p) if is_offloaded(p) else p
                opt.write_param(h, as_f32_numpy(value))
                self.mark(h)
                n += 1
        return n

    def new_params(self, param_groups: List[Dict[str, Any]]) -> List[Tuple[int, Any]]:
        """Checks ``param_groups`` against the registered parameters (see the module doc).

        :returns: (group index, parameter) of each parameter to register, in order.
        :raises ValueError: an edit strata cannot follow, naming the group.
        """
        n = len(self.params)
        pos = 0
        seen: Dict[int, int] = {}
        fresh: List[Tuple[int, Any]] = []
        for gi, group in enumerate(param_groups):
            for p in group["params"]:
                if id(p) in seen:
                    raise ValueError(
                        f"param group {gi}: a parameter is listed twice in param_groups "
                        f"(also in param group {seen[id(p)]}); strata offloaded optimizers "
                        "step each parameter once")
                seen[id(p)] = gi
                if pos < n:
                    at = self._position(p)
                    if at != pos or self.groups[pos] != gi:
                        raise self._refusal(gi, pos, at)
                elif id(p) in self.handle:
                    raise self._refusal(gi, pos, self._position(p))
                else:
                    check_param(p, pos)
                    fresh.append((gi, p))
                pos += 1
        if pos < n:
            gi = self.groups[pos]
            raise ValueError(
                f"param group {gi}: registered parameter {pos} (and {n - pos - 1} after it) "
                "is no longer in param_groups; strata offloaded optimizers follow "
                "parameters appended to the last group or in new groups, but cannot remove "
                "parameters or groups (set requires_grad=False / grad=None to stop "
                "stepping a parameter, or build a new optimizer)")
        return fresh

    def _position(self, p: Any) -> Optional[int]:
        h = self.handle.get(id(p))
        return None if h is None else self._pos[h]

    def _refusal(self, gi: int, pos: int, h: Optional[int]) -> ValueError:
        """``h``: the position the parameter was registered at (None: not registered)."""
        if h is None:
            what = "holds a parameter the optimizer does not know"
        elif self.groups[h] != gi:
            what = f"holds registered parameter {h} of param group {self.groups[h]}"
        else:
            what = f"lists registered parameter {h} at position {pos}"
        return ValueError(
            f"param group {gi}: {what}, an edit of param_groups strata cannot follow "
            "(registered parameters must stay where they were registered; new ones may be "
            "appended to the last group or given in new groups, e.g. with add_param_group)")
