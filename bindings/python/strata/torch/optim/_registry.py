"""How strata.torch's optimizers register their parameters with strata: each param group
and parameter of ``param_groups`` becomes a strata param group / tensor of the C++
optimizer (masters from the parameters' values, or, at a resume, the checkpoint's masters
copied into the parameters), edits of ``param_groups`` are followed (optim/_param_table.py
for the rules, optim/_layout.py for which strata group each parameter's update uses), and
the groups' hyperparameters are pushed to strata when they change (a scheduler's lr).

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from ..offload import note_checkpoint_value, offload_of
from . import _hyperparams, _layout, _names
from ._checkpoints import Checkpoints
from ._exchange import copy_master_to_param, master_from_blocks
from ._param_table import ParamTable, check_param, state_numel
from ._torch_kwargs import TorchFlags


class ParamRegistry:
    """The registration side of one optimizer (composed into it as ``_registry``).

    :param table: its ParamTable (``core``: the strata.OffloadedOptimizer).
    :param rule: strata's rule ("adam" / "adamw"), whose checks are torch's.
    :param flags: the class's torch keyword arguments.
    :param tier: where new parameters' state lives.
    """

    def __init__(self, table: ParamTable, rule: str, flags: TorchFlags, tier: str):
        self.table, self.tier = table, tier
        self.rule, self.flags = rule, flags
        #: id(param) -> the name given with it (``(name, param)`` pairs)
        self.names_by_id: Dict[int, str] = {}
        #: per strata group (slot, optim/_layout.py): the hyperparameters strata holds
        self.pushed: List[Dict[str, float]] = []
        #: id(group dict) -> the group, for every param group checked and registered (a
        #: group dict not among them is new: filled with defaults and checked)
        self._seen: Dict[int, Dict[str, Any]] = {}
        #: resume with a layout record (optim/_layout.py): per group, the strata group whose
        #: hyperparameters it takes (-1: none); None otherwise
        self.resume_hp_slots: Optional[List[int]] = None
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
        self._seen[id(group)] = group
        if resuming:
            s = gi if self.resume_hp_slots is None else self.resume_hp_slots[gi]
            if s >= 0:
                _hyperparams.adopt_checkpoint(group, core.hyperparams(s), self.flags.who, gi)
        hp = _hyperparams.to_strata(group)
        if not resuming:  # the whole group's disk space first: one clear error
            core.check_disk_space([state_numel(p) for p in group["params"]])
        if gi >= core.num_param_groups():
            got = core.add_param_group(hp)
            assert got == gi, (got, gi)
        if not resuming:
            self.pushed.append(hp)
        for p in group["params"]:
            if resuming:  # checked by Checkpoints.check_layout / _layout.resume_handles
                pos = len(table.params)
                h = self.resume_handles[pos]
                if h is None:
                    h = self.checkpoints.add_legacy_empty_param(
                        _names.strata_name(pos, self.names_by_id.get(id(p))), pos, gi)
                copy_master_to_param(core, h, p)
                if offload_of(p) is None:  # a later offload_parameters(resume=True) keeps it
                    note_checkpoint_value(p)
                table.add(p, h, core.param_info(h)["group"])
                self._bind(p)
            else:
                self.register_param(gi, p)

    def prepare_resume(self, param_groups: List[Dict[str, Any]], key_prefix: str) -> None:
        """resume, before registering: which checkpointed tensor each given parameter
        takes (``resume_handles``): by the layout record where the checkpoint has one
        (optim/_layout.py: by name, else by position), else by position (Checkpoints
        .check_layout).

        :raises ValueError: a parameter the checkpoint cannot give (naming it)."""
        record = _layout.read_record(self.table.core)
        if record is None:
            self.resume_handles = self.checkpoints.check_layout(param_groups, self.names_by_id)
            return
        self.resume_handles = _layout.resume_handles(self.table.core, record, param_groups,
                                                     self.names_by_id, key_prefix)
        self.resume_hp_slots = record["hp_slots"]
        self.table.internal = list(record["records"])

    def finish_resume(self) -> None:
        """After a resume registered every group: each strata group's hyperparameters as
        strata holds them."""
        core = self.table.core
        self.pushed = [_hyperparams.to_strata(_hyperparams.from_strata(core.hyperparams(s)))
                       for s in range(core.num_param_groups())]

    def register_param(self, gi: int, p: torch.Tensor) -> None:
        """A new parameter of group ``gi``: master from its current value, zero moments."""
        table = self.table
        o = offload_of(p)
        name = _names.strata_name(table.core.num_params(), self.names_by_id.get(id(p)))
        if o is not None and o.tiled(p):  # block by block: never the whole value in memory
            h = table.core.add_param(name, state_numel(p), None, group=gi, placement=self.tier)
            master_from_blocks(table.core, h, p)
        else:
            value = o.read_state(p) if o is not None else p.detach()
            init = value.reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
            h = table.core.add_param(name, state_numel(p), init, group=gi,
                                     placement=self.tier)
        table.add(p, h, gi)
        self._bind(p)
        if self.on_new_param is not None:
            self.on_new_param(p)

    def _bind(self, p: torch.Tensor) -> None:
        """An offloaded parameter's gradients go to its offload's store from now on."""
        o = offload_of(p)
        if o is not None:  # (fp32 sums: grad_accumulation_dtype, offload/_grad_sum.py)
            accum = self.table.accum
            o.bind_optimizer(p, accum is not None and accum.mode == "float32")

    def sync_params(self, param_groups: List[Dict[str, Any]], defaults: Dict[str, Any]) -> bool:
        """Follows ``param_groups`` (optim/_param_table.py, optim/_layout.py): checks it
        before anything changes, fills group dicts it has not seen with ``defaults`` (as
        add_param_group does) and checks them, then sets strata's hyperparameters, moves
        parameters whose group needs another strata group, registers new parameters (their
        disk space checked at once first), and takes the current value of every parameter
        changed outside the optimizer as its master.

        :returns: whether the parameters or their grouping changed since the last sync.
        :raises ValueError: a parameter listed twice (naming both places), a new group's
            hyperparameter out of range or a new parameter's dtype (naming the group /
            parameter); strata's InvalidArgumentError for a hyperparameter it refuses.
        :raises TypeError: a ``params`` entry that is not a tensor (naming it).
        :raises strata.DiskFullError: the new parameters' or moved ones' state does not fit.
        """
        new = []
        for gi, group in enumerate(param_groups):
            if id(group) in self._seen:
                continue
            for k, v in defaults.items():
                group.setdefault(k, v)
            new.append((gi, group))
        for gi, group in enumerate(param_groups):
            if torch.is_tensor(group.get("params")):
                group["params"] = [group["params"]]
            elif not isinstance(group.get("params"), list):
                group["params"] = list(group["params"])
        self._check_listing(param_groups)
        for gi, group in new:
            self.check_group(group, f"param group {gi}: ")
        changed = self.table.layout_changed(param_groups)
        self._follow(param_groups)
        self._seen.update((id(g), g) for _, g in new)
        self.table.take_changed()
        return changed

    def listing_error(self, param_groups: List[Dict[str, Any]]) -> Optional[Exception]:
        """The error sync_params would raise for the listing of ``param_groups`` (a
        parameter twice, a non-tensor), else None."""
        try:
            self._check_listing(param_groups)
        except (TypeError, ValueError, KeyError) as e:
            return e
        return None

    def _check_listing(self, param_groups: List[Dict[str, Any]]) -> None:
        seen: Dict[int, str] = {}
        i = 0
        for gi, group in enumerate(param_groups):
            for j, p in enumerate(group["params"]):
                where = f"param group {gi}, params[{j}]"
                if not torch.is_tensor(p):
                    raise TypeError(f"{where} is a {type(p).__name__}: torch.optim can only "
                                    "optimize Tensors")
                if id(p) in seen:
                    raise ValueError(
                        f"{where}: a parameter listed twice in param_groups (also at "
                        f"{seen[id(p)]}); strata offloaded optimizers step each parameter "
                        "once (torch.optim would step it twice): list it once")
                seen[id(p)] = where
                if self.table.handle_of(p) is None:
                    check_param(p, i)
                i += 1

    def _follow(self, param_groups: List[Dict[str, Any]]) -> None:
        """The plan of optim/_layout.py carried out (hyperparameters first: a value strata
        refuses changes no parameter)."""
        table, core = self.table, self.table.core
        plan = _layout.plan(table, param_groups, self.pushed)
        for s, hp in plan.push.items():
            core.set_hyperparams(s, hp)
            self.pushed[s] = hp
        grow = [state_numel(p) for p, _ in plan.fresh]
        grow += [state_numel(p) for p, s in plan.moves
                 if not any(q is p and table.slot[r] == s for r, q in table.retired.items())]
        if grow:  # every new tensor's disk space first: one clear error, nothing added
            core.check_disk_space(grow)
        for hp in plan.new_slots:
            core.add_param_group(hp)
            self.pushed.append(hp)
        for p, s in plan.moves:
            _layout.move(table, p, s, _names.strata_name(
                core.num_params(), self.names_by_id.get(id(p))), self.tier)
        for p, s in plan.fresh:
            self.register_param(s, p)
        table.rebuild(param_groups)

    def sync_hyperparams(self, param_groups: List[Dict[str, Any]]) -> None:
        """The groups' hyperparameters into strata (after sync_params: parameters whose
        group's values now differ from their strata group's are moved, see
        optim/_layout.py)."""
        self._follow(param_groups)

    def amsgrad(self) -> bool:
        """Whether strata's state streams were made with amsgrad (one value for all)."""
        return bool(self.pushed[0]["amsgrad"])
