"""``optimizer.state`` of strata.torch's optimizers: torch.optim.Adam's per-parameter state
(``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad) read from strata
when accessed.

* ``opt.state[p]`` of a parameter that has stepped is a dict: ``step`` a 0-d float32 tensor
  (as torch 1.13's Adam), the moments fp32 CPU tensors shaped like ``p`` (the fp32 values
  strata holds, whatever the parameter's dtype or device). Each access of a parameter
  after a step reads its state from strata (a copy: NVMe reads for the nvme tier); the
  dict is kept until the next step, so repeated access returns the same tensors.
* ``len(opt.state)`` and iteration count the parameters that have stepped, as torch's,
  those removed from every group included (their state stays, as in torch's);
  ``state[q]`` of a parameter that has not (or is not in the optimizer) is ``{}``
  (nothing is inserted).
* Writing: edits of those tensors in place (``state[p]["exp_avg"].zero_()``), assignment
  of an entry (``state[p]["step"] = torch.tensor(0.)``) or of a whole dict
  (``state[p] = {...}``) are written back to strata before the next step / checkpoint() /
  state_dict(); ``del state[p]`` restarts ``p`` (zero moments, step 0), as torch's lazy
  initialization would. Assigning another key, or a tensor with another element count,
  raises ValueError/KeyError at once naming the parameter and key.
* Pickling the optimizer's state gives a plain ``defaultdict(dict)`` of these dicts.

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

import numpy as np
import torch

from ._exchange import as_f32_numpy
from ._param_table import ParamTable, state_numel


class _Entry(dict):
    """One parameter's state dict; remembers what was assigned and each tensor's version
    at materialization, so edits are written back."""

    def __init__(self, view: "StateView", h: int, values: Dict[str, Any]):
        super().__init__(values)
        self._view = view
        self._h = h
        self.dirty: Set[str] = set()
        self.versions = {k: v._version for k, v in values.items() if torch.is_tensor(v)}

    def __setitem__(self, key: str, value: Any) -> None:
        self._view._check_value(self._h, key, value)
        super().__setitem__(key, value)
        self.dirty.add(key)

    def __delitem__(self, key: str) -> None:
        raise KeyError(f"optimizer.state[p]: '{key}' cannot be deleted (strata holds it); "
                       "del optimizer.state[p] restarts the parameter")

    def changed(self) -> List[str]:
        return [k for k, v in self.items()
                if k in self.dirty or (torch.is_tensor(v) and v._version != self.versions.get(k))]


class StateView(collections.abc.MutableMapping):
    """The mapping ``opt.state`` (see the module doc).

    :param table: the optimizer's ParamTable (its ``core``: the strata.OffloadedOptimizer
        holding the state; None once closed).
    :param before_read: called before state is read or restarted (the optimizer's
        rollback of an overlapped step in flight); it must not hold the optimizer strongly
        (a weak callable), so ``del opt`` still closes it at once.
    """

    def __init__(self, table: ParamTable, before_read: Callable[[], None]):
        self._table = table
        self._before_read = before_read
        self._cache: Dict[int, _Entry] = {}

    # ---- helpers ---------------------------------------------------------------------

    def _handle_of(self, p: Any) -> Optional[int]:
        return self._table.handle_of(p)

    def _check_value(self, h: int, key: str, value: Any) -> None:
        names = self._table.state_names()
        p = self._table.param_of(h)
        if key == "step":
            step = float(value.item() if torch.is_tensor(value) else value)
            if not (step >= 0 and step == int(step)):
                raise ValueError(f"optimizer.state[p] of parameter {h}: step {step} is not an "
                                 "integer >= 0")
            return
        if key not in names:
            raise KeyError(f"optimizer.state[p] of parameter {h}: strata holds only "
                           f"{['step'] + names}, not '{key}'")
        n = value.numel() if torch.is_tensor(value) else int(np.asarray(value).size)
        if n != state_numel(p):
            raise ValueError(f"optimizer.state[p] of parameter {h}: '{key}' has {n} elements, "
                             f"the parameter has {state_numel(p)}")

    def _read(self, h: int) -> _Entry:
        self._before_read()  # not an overlapped step's speculative state
        o, p = self._table.core, self._table.param_of(h)
        values: Dict[str, Any] = {"step": torch.tensor(float(o.step_count(h)))}
        for k, name in enumerate(self._table.state_names()):
            values[name] = torch.from_numpy(o.read_state(h, k)).view(p.shape)
        return _Entry(self, h, values)

    # ---- the optimizer's hooks ---------------------------------------------------------

    def write_back(self) -> None:
        """Writes edited or assigned entries to strata (before a step, checkpoint(),
        state_dict()); the cached dicts stay valid."""
        if not self._cache:
            return
        o = self._table.core
        names = self._table.state_names()
        for h, e in self._cache.items():
            for key in e.changed():
                v = e[key]
                if key == "step":
                    o.set_step_count(h, int(float(v.item() if torch.is_tensor(v) else v)))
                else:
                    o.write_state(h, names.index(key), as_f32_numpy(v))
                if torch.is_tensor(v):
                    e.versions[key] = v._version
            e.dirty.clear()

    def pending(self) -> bool:
        """Entries were edited or assigned since the last write_back()."""
        return any(e.changed() for e in self._cache.values())

    def invalidate(self) -> None:
        """Drops the cached dicts (after a step or load_state_dict: strata's values moved)."""
        self._cache.clear()

    # ---- the mapping -------------------------------------------------------------------

    def __getitem__(self, p: Any) -> Dict[str, Any]:
        h = self._handle_of(p)
        if h is None or self._table.core is None:
            return {}
        e = self._cache.get(h)
        if e is None:
            if self._table.core.step_count(h) == 0:
                return {}
            e = self._cache[h] = self._read(h)
        return e

    def __setitem__(self, p: Any, value: Dict[str, Any]) -> None:
        h = self._handle_of(p)
        if h is None:
            raise KeyError("optimizer.state: the parameter is not in this optimizer")
        for k, v in value.items():
            self._check_value(h, k, v)
        e = self._read(h)
        for k, v in value.items():
            dict.__setitem__(e, k, v)
        e.dirty.update(value)
        self._cache[h] = e

    def __delitem__(self, p: Any) -> None:
        self._before_read()  # restarting p must not meet an open overlapped step
        h = self._handle_of(p)
        if h is None:
            raise KeyError("optimizer.state: the parameter is not in this optimizer")
        o = self._table.core
        zeros = np.zeros(state_numel(self._table.param_of(h)), dtype=np.float32)
        for k in range(o.num_states()):
            o.write_state(h, k, zeros)
        o.set_step_count(h, 0)
        self._cache.pop(h, None)

    def __contains__(self, p: Any) -> bool:
        h = self._handle_of(p)
        return h is not None and self._table.core is not None and (
            h in self._cache or self._table.core.step_count(h) > 0)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self._table.core is None:
            return iter(())
        return iter([p for h, p in self._table.known()
                     if h in self._cache or self._table.core.step_count(h) > 0])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<strata optimizer state of {len(self)} parameter(s)>"

    def __reduce__(self):
        return (collections.defaultdict, (dict, {p: dict(self[p]) for p in self}))
