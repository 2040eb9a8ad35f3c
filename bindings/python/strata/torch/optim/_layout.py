"""How strata.torch's optimizers follow ``param_groups`` edits: which strata param group
("slot") each parameter's update uses, and the layout record that lets a resume find each
parameter after edits.

Slots. strata fixes a tensor's param group when the tensor is made, while torch.optim lets
a parameter change groups. So strata's groups are hyperparameter slots: at each sync every
slot in use takes the hyperparameters of the torch group(s) its parameters are in now --
its current ones when some of its parameters still need them, else those most of its
elements need -- and a parameter whose torch group needs others is *moved*: its master,
moments and step count are copied into a tensor of a slot that has them (a slot holding
its group's other parameters, else the slot of the group's index, else any slot with the
same values, else an unused one, else a new one). Removing, reordering or replacing
parameters, deleting or inserting groups, merging groups, and moving a parameter between
groups with equal hyperparameters move nothing. A move costs one read of the parameter's
state and one write (its masters and moments: 12 bytes per element, 16 with amsgrad); the
old tensor stays in the store (strata cannot delete a tensor) and is reused if the
parameter moves back to that slot. New parameters are registered into the slot chosen the
same way (in the common case, appending to a group or adding one, the group's own).

The layout record. While the layout is the one strata's checkpoint implies (parameter i
is tensor ``p<i>``, in slot = its group, nothing moved or removed) nothing more is stored.
Otherwise checkpoint() and close() first write a record into a strata tensor
``torch-layout-<n>`` of the same optimizer (so it is committed with the checkpoint, never
stepped): for each torch group its size and the slot whose hyperparameters it has, and for
each strata tensor its position in the flattened ``param_groups`` (-1: in no group, -2:
unused, -3: a layout record). Values are small integers, exact in fp32. A resume with a
record maps each given parameter by name where it has one (the name in its tensor's key),
else by position, and refuses naming the parameter where it cannot (see
:func:`resume_handles`).

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import _hyperparams, _names
from ._param_table import ParamTable, state_numel

_RECORD = re.compile(r"torch-layout-(\d+)\Z")
_VERSION = 1.0
KEPT, UNUSED, RECORD = -1, -2, -3


def _key(hp: Dict[str, float]) -> Tuple[Tuple[str, float], ...]:
    return tuple(sorted(hp.items()))


class Plan:
    """What a sync does: ``push`` (slot -> hyperparameters to set), ``new_slots`` (the
    hyperparameters of slots to add, in order), ``moves`` and ``fresh`` ((parameter, slot)
    to move / register, in param_groups order)."""

    def __init__(self) -> None:
        self.push: Dict[int, Dict[str, float]] = {}
        self.new_slots: List[Dict[str, float]] = []
        self.moves: List[Tuple[torch.Tensor, int]] = []
        self.fresh: List[Tuple[torch.Tensor, int]] = []


def plan(table: ParamTable, param_groups: List[Dict[str, Any]],
         pushed: List[Dict[str, float]]) -> Plan:
    """The plan that makes every parameter of ``param_groups`` update with its group's
    hyperparameters (see the module doc). ``pushed``: each slot's hyperparameters in
    strata now (to_strata's names). Pure: nothing is changed."""
    need = [_hyperparams.to_strata(g) for g in param_groups]
    out = Plan()
    members: Dict[int, List[Tuple[int, torch.Tensor]]] = {}
    incoming: List[Tuple[int, torch.Tensor, bool]] = []  # (group, param, is_fresh)
    for gi, g in enumerate(param_groups):
        for p in g["params"]:
            h = table.handle_of(p)
            if h is None:
                incoming.append((gi, p, True))
            else:
                members.setdefault(table.slot[h], []).append((gi, p))
    taken: Dict[int, Tuple] = {}  # slot -> key of the hyperparameters it gets
    at: Dict[int, Dict[int, int]] = {}  # group -> {slot: parameters of it staying there}
    for s in sorted(members):
        weight: Dict[Tuple, int] = {}
        for gi, p in members[s]:
            k = _key(need[gi])
            weight[k] = weight.get(k, 0) + p.numel() + 1
        cur = _key(pushed[s])
        taken[s] = cur if cur in weight else max(weight, key=lambda k: weight[k])
        for gi, p in members[s]:
            if _key(need[gi]) == taken[s]:
                at.setdefault(gi, {})
                at[gi][s] = at[gi].get(s, 0) + 1
            else:
                incoming.append((gi, p, False))
    n_slots = len(pushed)
    hp_of: Dict[Tuple, Dict[str, float]] = {_key(h): h for h in need}

    def claim(s: int, k: Tuple, gi: int) -> int:
        if s not in taken:
            taken[s] = k
            if s < n_slots:
                out.push[s] = hp_of[k]
        at.setdefault(gi, {})
        at[gi][s] = at[gi].get(s, 0) + 1
        return s

    def target(gi: int) -> int:
        k = _key(need[gi])
        own = [(c, -s) for s, c in at.get(gi, {}).items() if taken.get(s) == k]
        if own:
            return claim(-max(own)[1], k, gi)
        total = n_slots + len(out.new_slots)
        if gi < total and taken.get(gi, k) == k:
            return claim(gi, k, gi)  # the slot of the group's index
        if gi == total:  # a group appended: a slot of its own, as add_param_group
            out.new_slots.append(hp_of[k])
            return claim(total, k, gi)
        same = sorted(s for s, t in taken.items() if t == k)
        if same:
            return claim(same[0], k, gi)
        idle = [s for s in range(total) if s not in taken]
        if idle:
            return claim(idle[0], k, gi)
        out.new_slots.append(hp_of[k])
        return claim(total, k, gi)

    incoming.sort(key=lambda e: e[0])  # in group order: the first of a group picks its slot
    for gi, p, fresh in incoming:
        (out.fresh if fresh else out.moves).append((p, target(gi)))
    for s, k in taken.items():
        if s < n_slots and k != _key(pushed[s]):
            out.push[s] = hp_of[k]
    return out


def move(table: ParamTable, p: torch.Tensor, slot: int, name: str, tier: str) -> None:
    """Moves ``p``'s master, moments and step count into a tensor of strata group ``slot``
    (a tensor it used there before, else a new one named ``name``)."""
    core = table.core
    old = table.handle_of(p)
    h = next((r for r, q in table.retired.items() if q is p and table.slot[r] == slot), None)
    master = core.read_param(old)
    if h is None:
        h = core.add_param(name, state_numel(p), master, group=slot, placement=tier)
    else:
        core.write_param(h, master)
    for k in range(core.num_states()):
        core.write_state(h, k, core.read_state(old, k))
    core.set_step_count(h, core.step_count(old))
    table.rehome(p, h, slot)


def trivial(table: ParamTable) -> bool:
    """The layout of the last sync is the one a checkpoint without record implies (see the
    module doc)."""
    core = table.core
    n = len(table.params)
    return (not table.kept() and core.num_params() == n and not table.internal
            and core.num_param_groups() == table.n_groups
            and all(table.handle[id(p)] == i and table.slot[i] == table.groups[i]
                    for i, p in enumerate(table.params)))


def write_record(table: ParamTable, tier: str) -> None:
    """Writes the layout record of the last sync (``table``'s) before a checkpoint (see the
    module doc) when that layout is not trivial or a record exists; committed by the
    checkpoint that follows."""
    if trivial(table):
        return
    core = table.core
    sizes = [0] * table.n_groups
    hp_slots = [KEPT] * table.n_groups
    for p, gi in zip(table.params, table.groups):
        sizes[gi] += 1
        hp_slots[gi] = table.slot[table.handle[id(p)]]
    need = 3 + 2 * len(sizes) + core.num_params() + 1
    rec = table.internal[-1] if table.internal else None
    if rec is None or core.param_info(rec)["numel"] < need:
        numel = max(64, 2 * need)
        rec = core.add_param(f"torch-layout-{core.num_params()}", numel, None, group=0,
                             placement=tier)
        table.internal.append(rec)
    pos = np.full(core.num_params(), UNUSED, dtype=np.float32)
    for i, p in enumerate(table.params):
        pos[table.handle[id(p)]] = i
    for h, _ in table.kept():
        pos[h] = KEPT
    for h in table.internal:
        pos[h] = RECORD
    values = np.concatenate([np.array([_VERSION, len(pos), len(sizes)], dtype=np.float32),
                             np.array(sizes + hp_slots, dtype=np.float32), pos])
    buf = np.zeros(core.param_info(rec)["numel"], dtype=np.float32)
    buf[:len(values)] = values
    core.write_param(rec, buf)


def read_record(core: Any) -> Optional[Dict[str, Any]]:
    """resume: the layout record of the checkpoint ``core``, or None without one:
    ``{"handle": its tensor, "sizes": per group, "hp_slots": per group, "pos": per tensor,
    "records": every record tensor}``."""
    records = [h for h in range(core.num_params())
               if _RECORD.match(core.param_info(h)["name"])]
    if not records:
        return None
    v = core.read_param(records[-1])
    n, g = int(v[1]), int(v[2])
    if v[0] != _VERSION or len(v) < 3 + 2 * g + n:
        raise ValueError(f"the optimizer's layout record '{core.param_info(records[-1])['name']}'"
                         f" has version {v[0]} or is truncated; this strata reads version "
                         f"{_VERSION}")
    pos = [int(x) for x in v[3 + 2 * g:3 + 2 * g + n]]
    pos += [UNUSED] * (core.num_params() - n)  # made after the record was written
    return dict(handle=records[-1], sizes=[int(x) for x in v[3:3 + g]],
                hp_slots=[int(x) for x in v[3 + g:3 + 2 * g]], pos=pos, records=records)


def _name_of(core: Any, h: int) -> Optional[str]:
    m = _names.INDEX.match(core.param_info(h)["name"])
    return m.group(2) if m else None


def resume_handles(core: Any, record: Dict[str, Any], param_groups: List[Dict[str, Any]],
                   names_by_id: Dict[int, str], key_prefix: str) -> Dict[int, int]:
    """resume with a layout record: flattened parameter index -> its tensor. A parameter
    given with a name takes the tensor of that name (whatever its group or position then:
    a move), one without takes the tensor at its position (the groups' sizes must then be
    the checkpoint's).

    :raises ValueError: naming the parameter (group, index, name): another number of
        groups than the checkpoint's; a name or position the checkpoint does not hold; a
        tensor given twice; another element count; a parameter the checkpoint has in a
        group that the model does not give; group sizes that differ for a parameter given
        without name.
    """
    where = f"the checkpoint under '{key_prefix}'"
    if len(param_groups) != len(record["sizes"]):
        raise ValueError(f"{where} has {len(record['sizes'])} param group(s), the optimizer "
                         f"was given {len(param_groups)}; give the parameters in the "
                         "checkpoint's groups")
    pos = record["pos"]
    live = [h for h, x in enumerate(pos) if x >= KEPT]
    by_name: Dict[str, int] = {}
    for h in live:
        n = _name_of(core, h)
        if n:
            by_name.setdefault(n, h)
    by_pos = {x: h for h, x in enumerate(pos) if x >= 0}
    bounds = np.cumsum([0] + record["sizes"])
    out: Dict[int, int] = {}
    used: Dict[int, int] = {}
    i = 0
    for gi, g in enumerate(param_groups):
        for j, p in enumerate(g["params"]):
            name = names_by_id.get(id(p))
            what = f"parameter {j} of param group {gi}" + (f" ('{name}')" if name else "")
            if name:
                h = by_name.get(_names.escape(name))
                if h is None:
                    raise ValueError(f"{where} holds no parameter named '{name}' ({what})")
            else:
                if len(g["params"]) != record["sizes"][gi]:
                    raise ValueError(f"{where}: param group {gi} has {record['sizes'][gi]} "
                                     f"parameters, the model gives {len(g['params'])}: "
                                     f"{what} has no name to find it by")
                h = by_pos.get(i)
                if h is None:
                    raise ValueError(f"{where} has no parameter at position {i} ({what})")
            if h in used:
                raise ValueError(f"{where}: {what} and parameter {used[h]} are both its "
                                 f"'{core.param_info(h)['name']}'")
            numel = core.param_info(h)["numel"]
            if numel != state_numel(p):
                raise ValueError(f"checkpointed parameter '{core.param_info(h)['name']}' has "
                                 f"{numel} elements, the model's {what} has {state_numel(p)}")
            out[i], used[h] = h, i
            i += 1
    for h in live:
        if pos[h] >= 0 and h not in used:
            gi = int(np.searchsorted(bounds, pos[h], side="right")) - 1
            raise ValueError(f"{where} holds parameter '{core.param_info(h)['name']}' in "
                             f"param group {gi}, the model does not give it (give every "
                             "parameter the checkpoint has in a group)")
    return out
