"""How strata.torch's optimizers register their parameters with strata: each param group
and parameter of ``param_groups`` becomes a strata param group / tensor of the C++
optimizer (masters from the parameters' values, or, at a resume, the checkpoint's masters
copied into the parameters), edits of ``param_groups`` are followed (see
optim/_param_table.py for the rules), and the groups' hyperparameters are pushed to strata
when they change (a scheduler's lr).

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from ..offload import offload_of
from . import _hyperparams, _names
from ._checkpoints import Checkpoints
from ._exchange import copy_master_to_param
from ._param_table import ParamTable, check_param, state_numel
from ._torch_kwargs import TorchFlags


class ParamRegistry:
    """The registration side of one optimizer (composed into it as ``_registry``).

    :param table: its ParamTable (``core``: the strata.OffloadedOptimizer).
    :param rule: strata's rule ("adam" / "adamw"), whose checks are torch's.
    :param flags: the class's torch keyword arguments.
    :param tier: where new parameters' state lives.
    :param clip: returns whether the optimizer clips (max_grad_norm > 0): offloaded
        parameters then keep their gradients' norms. A weak callable.
    """

    def __init__(self, table: ParamTable, rule: str, flags: TorchFlags, tier: str,
                 clip: Callable[[], bool]):
        self.table, self.tier = table, tier
        self.rule, self.flags = rule, flags
        self._clip = clip
        #: id(param) -> the name given with it (``(name, param)`` pairs)
        self.names_by_id: Dict[int, str] = {}
        #: per group: the hyperparameters strata holds (what sync_hyperparams compares to)
        self.pushed: List[Dict[str, float]] = []
        #: resume: parameter index -> handle in the checkpoint (None: a zero-size parameter
        #: that a checkpoint of an earlier version did not hold; see optim/_checkpoints.py);
        #: None when not resuming
        self.resume_handles: Optional[Dict[int, Optional[int]]] = None
        self.checkpoints: Optional[Checkpoints] = None  # set by the optimizer
        #: called with each parameter registered after construction (the backward overlap
        #: watches it)
        self.on_new_param: Optional[Callable[[torch.Tensor], None]] = None

    def split_names(self, param_group: Dict[str, Any], n_groups: int,
                    n_params: int) -> Dict[str, Any]:
        """add_param_group's group with ``(name, param)`` pairs split (names recorded) and
        each parameter checked; other groups as given (torch raises for them).

        :raises ValueError: a dtype strata cannot hold, a group mixing named and plain
            parameters (naming the parameter index / group).
        """
        if not (isinstance(param_group, dict) and "params" in param_group):
            return param_group
        params, names = param_group["params"], None
        if torch.is_tensor(params):
            params = [params]
        elif not isinstance(params, set):  # torch raises TypeError for sets
            params, names = _names.split_named(list(params), n_groups)
            for j, p in enumerate(params):
                check_param(p, n_params + j)
        if names is not None:
            self.names_by_id.update((id(p), n) for p, n in zip(params, names))
        return dict(param_group, params=params)

    def check_group(self, group: Dict[str, Any], where: str) -> None:
        """A group added after construction: its hyperparameters and torch flags in range,
        its amsgrad the optimizer's (ValueError naming ``where``)."""
        _hyperparams.check(self.rule, group, where)
        self.flags.check(group, where)
        _hyperparams.check_amsgrad(group, bool(self.pushed[0]["amsgrad"]), where)

    def register_group(self, gi: int, group: Dict[str, Any]) -> None:
        """Param group ``gi`` (and its parameters) into strata; at a resume, the
        checkpoint's group (its hyperparameters adopted) and masters."""
        core, table = self.table.core, self.table
        resuming = self.resume_handles is not None
        if resuming:
            _hyperparams.adopt_checkpoint(group, core.hyperparams(gi), self.flags.who, gi)
        hp = _hyperparams.to_strata(group)
        if not resuming:  # the whole group's disk space first: one clear error
            core.check_disk_space([state_numel(p) for p in group["params"]])
        if gi >= core.num_param_groups():
            got = core.add_param_group(hp)
            assert got == gi, (got, gi)
        self.pushed.append(hp)
        for p in group["params"]:
            if resuming:  # checked by Checkpoints.check_layout
                pos = len(table.params)
                h = self.resume_handles[pos]
                if h is None:
                    h = self.checkpoints.add_legacy_empty_param(
                        _names.strata_name(pos, self.names_by_id.get(id(p))), pos, gi)
                copy_master_to_param(core, h, p)
                table.add(p, h, gi)
                self._bind(p)
            else:
                self.register_param(gi, p)

    def register_param(self, gi: int, p: torch.Tensor) -> None:
        """A new parameter of group ``gi``: master from its current value, zero moments."""
        table = self.table
        o = offload_of(p)
        value = o.read_state(p) if o is not None else p.detach()
        init = value.reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
        name = _names.strata_name(len(table.params), self.names_by_id.get(id(p)))
        h = table.core.add_param(name, state_numel(p), init, group=gi, placement=self.tier)
        table.add(p, h, gi)
        self._bind(p)
        if self.on_new_param is not None:
            self.on_new_param(p)

    def _bind(self, p: torch.Tensor) -> None:
        """An offloaded parameter's gradients go to its offload's store from now on."""
        o = offload_of(p)
        if o is not None:
            o.bind_optimizer(p, clip=bool(self._clip()))

    def sync_params(self, param_groups: List[Dict[str, Any]], defaults: Dict[str, Any]) -> None:
        """Follows ``param_groups`` (see optim/_param_table.py): checks it before anything is
        registered, then registers groups appended to it directly (filled with
        ``defaults`` as add_param_group does) and new parameters, and takes the current
        value of every parameter changed outside the optimizer as its master.

        :raises ValueError: an edit strata cannot follow, a new group's hyperparameter out
            of range or a new parameter's dtype (naming the group / parameter).
        """
        fresh = self.table.new_params(param_groups)
        n_groups = len(self.pushed)
        for gi in range(n_groups, len(param_groups)):
            group = param_groups[gi]
            if not isinstance(group.get("params"), list):
                group["params"] = ([group["params"]] if torch.is_tensor(group["params"])
                                   else list(group["params"]))
            for k, v in defaults.items():
                group.setdefault(k, v)
            self.check_group(group, f"param group {gi}: ")
        if fresh:  # every new parameter's disk space first: one clear error, nothing added
            self.table.core.check_disk_space([state_numel(p) for _, p in fresh])
        for gi in range(n_groups, len(param_groups)):
            self.register_group(gi, {**param_groups[gi], "params": []})
        for gi, p in fresh:
            self.register_param(gi, p)
        self.table.take_changed()

    def sync_hyperparams(self, param_groups: List[Dict[str, Any]]) -> None:
        """The registered groups' hyperparameters into strata (groups appended to
        ``param_groups`` directly are registered by sync_params first)."""
        for gi, group in enumerate(param_groups[:len(self.pushed)]):
            hp = _hyperparams.to_strata(group)
            if hp != self.pushed[gi]:
                self.table.core.set_hyperparams(gi, hp)
                self.pushed[gi] = hp

    def amsgrad(self) -> List[bool]:
        """Per registered group: whether strata's state streams were made with amsgrad."""
        return [bool(hp["amsgrad"]) for hp in self.pushed]
