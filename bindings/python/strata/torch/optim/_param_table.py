"""The parameters of strata.torch's optimizers as ``param_groups`` shows them: which strata
handle each has (state keyed by the parameter object, as torch.optim's), and parameters
changed outside the optimizer.

Rules (documented in the package doc and docs/offload.md):

* Each step (and each checkpoint() / state_dict()) walks ``param_groups`` (optim/_layout.py
  plans what follows from it). A parameter keeps its strata handle -- its master, moments
  and step count -- whatever group or position it is in now, as torch.optim's state follows
  the tensor: parameters may be removed, reordered, replaced, moved between groups, groups
  deleted or inserted. A parameter removed from every group keeps its handle and state
  (``optimizer.state[p]`` still shows it) and continues from it when it comes back.
  Parameters the optimizer has not seen are registered fresh, as ``add_param_group`` would
  (masters from their current values, zero moments, step 0). A parameter listed twice
  raises ValueError naming both places (torch would step it twice).
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

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .._common import GRAD_DTYPES
from ..offload import is_offloaded, offload_of, restored_from
from ._exchange import as_f32_numpy, master_from_blocks


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


def offloaded_unchanged(before: Tuple[int, int], p: torch.Tensor) -> bool:
    """``p`` was offloaded (strata.torch.offload_parameters) after an optimizer saw it in
    memory as ``before`` (``(p._version, p.data_ptr())``), unchanged there since, and the
    offload stored ``p``'s value (not resume; or resume of a value this optimizer's resumed
    checkpoint gave p: offload/_parameter.py, note_checkpoint_value): the master and the
    stored value agree already and the master stays (a bf16 master keeps its precision)."""
    o = offload_of(p)
    was = None if o is None else o.offloaded_from(p)
    return was is not None and was[0] == before and not was[1]


def restored_unchanged(old: Any, p: torch.Tensor) -> bool:
    """An optimizer's mark ``old`` of ``p`` was offloaded (``("offloaded", version)``) and
    the offload's close() put ``p`` back in memory with that version's value, unchanged
    since (``restored_from``): the value is the master rounded to ``p``'s dtype and the
    master stays (an fp16/bf16 parameter's fp32 master keeps its precision)."""
    return (isinstance(old, tuple) and len(old) == 2 and old[0] == "offloaded"
            and restored_from(p) == old[1])


def take_value(core: Any, h: int, p: torch.Tensor) -> None:
    """``p``'s current value (widened exactly to fp32) into the master of handle ``h``:
    an offloaded one's stored value (a tiled one block by block, never whole in memory),
    else ``p`` itself."""
    if is_offloaded(p) and offload_of(p).tiled(p):
        master_from_blocks(core, h, p)
    else:
        core.write_param(h, as_f32_numpy(offload_of(p).read_state(p) if is_offloaded(p) else p))


class ParamTable:
    """The parameters the optimizer knows and their strata handles.

    ``params`` / ``groups``: the parameters ``param_groups`` shows, in its order (flattened),
    and the param group of each, as of the last :meth:`rebuild` (what a step steps);
    ``handle``: id(param) -> strata handle of those. Parameters removed from every group keep
    their handle (:meth:`handle_of`, :meth:`known`); ``slot``: handle -> strata param group
    (whose hyperparameters its update uses; see optim/_layout.py)."""

    def __init__(self) -> None:
        #: the strata.OffloadedOptimizer holding the handles (None until it is created and
        #: after the optimizer closed)
        self.core: Any = None
        #: the parameters of param_groups in its order, and their param group indices
        self.params: List[torch.Tensor] = []
        self.groups: List[int] = []
        #: id(param) -> strata handle, for the parameters of param_groups
        self.handle: Dict[int, int] = {}
        #: strata handle -> strata param group (fixed when the handle is made)
        self.slot: Dict[int, int] = {}
        #: strata handle -> the parameter it holds (every known one, in or out of groups)
        self._param: Dict[int, torch.Tensor] = {}
        #: id(param) -> handle, for known parameters in no group now
        self._kept: Dict[int, int] = {}
        #: handles no parameter uses any more (a parameter moved to another strata group),
        #: with the parameter they held: reused if it moves back (see optim/_layout.py)
        self.retired: Dict[int, torch.Tensor] = {}
        #: handles of strata tensors that are not parameters (the layout record)
        self.internal: List[int] = []
        #: by handle: (version, data_ptr) of its parameter when the optimizer last wrote or
        #: read it (None: take it at the next sync)
        self._marks: Dict[int, Optional[Tuple[int, int]]] = {}
        self._layout: List[Tuple[int, int]] = []  # (group, id(param)) of the last rebuild
        self.n_groups = 0  # len(param_groups) at the last rebuild
        #: the optimizer's GradAccumulation (optim/_grad_accum.py): ``accum.grad(p)`` is the
        #: gradient the step takes for in-memory ``p`` (its fp32 sum, or ``p.grad``)
        self.accum: Any = None

    def add(self, p: torch.Tensor, h: int, slot: int) -> None:
        """Registers ``p`` as strata handle ``h`` of strata group ``slot``, appended to
        ``params`` (the next :meth:`rebuild` puts it where param_groups has it)."""
        self.params.append(p)
        self.groups.append(slot)
        self.handle[id(p)] = h
        self._kept.pop(id(p), None)
        self.slot[h] = slot
        self._param[h] = p
        self._marks[h] = _mark(p)

    def rehome(self, p: torch.Tensor, h: int, slot: int) -> None:
        """``p``'s state moved to handle ``h`` (strata group ``slot``); its old handle is
        retired."""
        old = self.handle_of(p)
        self.retired[old] = p
        del self._param[old]
        self.retired.pop(h, None)
        self._param[h] = p
        self.slot[h] = slot
        self._marks[h] = self._marks.pop(old)
        for m in (self.handle, self._kept):
            if id(p) in m:
                m[id(p)] = h

    def rebuild(self, param_groups: List[Dict[str, Any]]) -> None:
        """``params`` / ``groups`` / ``handle`` from ``param_groups`` (every parameter in it
        known); the others known are kept out of groups."""
        known = {id(p): h for h, p in self._param.items()}
        self.params = [p for g in param_groups for p in g["params"]]
        self.groups = [gi for gi, g in enumerate(param_groups) for _ in g["params"]]
        self.handle = {id(p): known[id(p)] for p in self.params}
        self._kept = {i: h for i, h in known.items() if i not in self.handle}
        self._layout = self.layout(param_groups)
        self.n_groups = len(param_groups)

    @staticmethod
    def layout(param_groups: List[Dict[str, Any]]) -> List[Tuple[int, int]]:
        return [(gi, id(p)) for gi, g in enumerate(param_groups) for p in g["params"]]

    def layout_changed(self, param_groups: List[Dict[str, Any]]) -> bool:
        """``param_groups`` lists other parameters, or in another order or grouping, than
        at the last :meth:`rebuild`."""
        return self.layout(param_groups) != self._layout

    def handle_of(self, p: Any) -> Optional[int]:
        """The handle of known parameter ``p`` (in a group or not), else None."""
        if not torch.is_tensor(p):
            return None
        h = self.handle.get(id(p))
        return self._kept.get(id(p)) if h is None else h

    def known(self) -> Iterator[Tuple[int, torch.Tensor]]:
        """(handle, parameter) of every known parameter, those of param_groups first in
        its order, then the ones in no group (in handle order)."""
        for p in self.params:
            yield self.handle[id(p)], p
        for h in sorted(self._kept.values()):
            yield h, self._param[h]

    def kept(self) -> List[Tuple[int, torch.Tensor]]:
        """(handle, parameter) of the known parameters in no group now."""
        return [(h, self._param[h]) for h in sorted(self._kept.values())]

    def state_names(self) -> List[str]:
        """The names of ``core``'s state streams (torch's: exp_avg, exp_avg_sq[,
        max_exp_avg_sq]), in stream order."""
        return [self.core.state_name(k) for k in range(self.core.num_states())]

    def param_of(self, h: int) -> torch.Tensor:
        """The parameter of strata handle ``h``."""
        return self._param[h]

    def mark(self, h: int) -> None:
        """The master of handle ``h`` and its parameter agree now (after a copy either way)."""
        self._marks[h] = _mark(self.param_of(h))

    def forget(self, h: int) -> None:
        """Handle ``h``'s parameter is to be taken as the master at the next sync."""
        self._marks[h] = None

    def changed(self, h: int) -> bool:
        """The parameter of ``h`` was changed outside the optimizer since the last mark."""
        return self._marks[h] != _mark(self.param_of(h))

    def _offloaded_since(self, p: torch.Tensor, h: int) -> bool:
        """:func:`offloaded_unchanged` since this optimizer's in-memory mark of ``p``.
        Returns True when so (marked)."""
        old = self._marks[h]
        if not isinstance(old, tuple) or not old or old[0] == "offloaded":
            return False
        if not offloaded_unchanged(old, p):
            return False  # changed in memory before, or an earlier run's value: take it
        self.mark(h)
        return True

    def _restored_since(self, p: torch.Tensor, h: int) -> bool:
        """:func:`restored_unchanged` since this optimizer's offloaded mark of ``p``.
        Returns True when so (marked)."""
        if not restored_unchanged(self._marks[h], p):
            return False  # changed after the close: take it
        self.mark(h)
        return True

    def take_changed(self) -> int:
        """Every changed parameter of param_groups: its current value (widened to fp32)
        into its master in ``core`` (one out of groups is taken when it comes back);
        returns how many were taken."""
        opt = self.core
        n = 0
        for o in offloads(self.params):
            o.write_back()  # edits of materialized offloaded parameters into their objects
        for p in self.params:
            h = self.handle[id(p)]
            if self.changed(h):
                if self._offloaded_since(p, h) or self._restored_since(p, h):
                    continue
                take_value(opt, h, p)
                self.mark(h)
                n += 1
        return n
