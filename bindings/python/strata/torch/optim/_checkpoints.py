"""Durability and state dicts of strata.torch's optimizers, composed into each as its
``_checkpoints`` member: overwrite and resume (the layout checks of a resume, checkpoints of
earlier versions), state_dict() in torch.optim.Adam's format and load_state_dict()'s checks
and writes. The optimizer's public checkpoint() / state_dict() / load_state_dict() sync
its parameters first and call these.

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional

import numpy as np
import torch

import strata

from .._common import UNIVERSAL_ROUTE
from . import _hyperparams, _names
from ._exchange import as_f32_numpy
from ._param_table import ParamTable, state_numel
from ._torch_kwargs import TorchFlags


def _numel(t: Any) -> int:
    return t.numel() if torch.is_tensor(t) else int(np.asarray(t).size)


def _step_value(step: Any) -> float:
    return float(step.item() if torch.is_tensor(step) else step)


def _world_size_hint(held: int, whole: int, wanted: int) -> str:
    """The end of check_layout's element-count error when ``held`` elements are what a rank
    of some other world size owns of a ``whole``-element parameter (ZeRO-3's partition,
    strata.distributed.partition_layout): "" when no world size up to 1024 gives it."""
    if wanted == held:
        return ""
    for size in range(1, min(whole, 1024) + 1):
        c = -(-whole // size)
        # rank r owns [min(r*c, whole), min((r+1)*c, whole)): c elements, or a short last slice
        if held == c or (held > 0 and held == whole % c):
            was = ("by one process (not partitioned)" if size == 1 else
                   f"by ZeRO-3 over {size} ranks (the {whole} elements partitioned)")
            return f"; it matches a checkpoint written {was}: " + UNIVERSAL_ROUTE
    return ""


class Checkpoints:
    """The checkpoint side of one optimizer.

    :param table: its ParamTable (``core``: the strata.OffloadedOptimizer, which holds
        every parameter, zero-size ones included; ``params`` in registration order).
    :param store: the strata.Store.
    :param key_prefix: the optimizer's key prefix in the store.
    :param tier: where new parameters' state lives ("nvme", "host", "auto").
    :param rule: strata's rule ("adam" / "adamw"), for the hyperparameter checks.
    :param flags: the class's torch keyword arguments (TorchFlags).
    """

    def __init__(self, table: ParamTable, store: Any, key_prefix: str, tier: str, rule: str,
                 flags: TorchFlags):
        self.table, self.store = table, store
        self.key_prefix, self.tier = key_prefix, tier
        self.rule, self.flags = rule, flags
        #: resume from a checkpoint of an earlier version: its zero-size parameters' step
        #: counts (index -> steps, from <key_prefix>torch/empty_steps); None without one
        self.legacy_empty_steps: Optional[Dict[int, int]] = None

    @property
    def _legacy_empty_steps_key(self) -> str:
        """Where earlier versions, whose strata did not hold zero-size parameters, kept
        their step counts: int64 of shape (n, 2), rows (parameter index, step count)."""
        return self.key_prefix + "torch/empty_steps"

    def open_core(self, resume: bool, overwrite: bool, path: Optional[str],
                  hyperparams: Dict[str, float], pipeline: Dict[str, Any], who: str) -> Any:
        """The C++ optimizer of this key prefix: resumed from its checkpoint, or created
        (after removing an old one with ``overwrite``); sets ``table.core``.

        :param hyperparams: the first group's (strata's names), for a new optimizer.
        :param pipeline: sub_group_numel, num_buffers, pinned_budget, host_budget,
            num_threads, arithmetic.
        :param who: the class name, for messages.
        :raises strata.AlreadyExistsError: a checkpoint exists and neither resume nor
            overwrite (the message says which to pass).
        :raises strata.NotFoundError: resume without a checkpoint.
        """
        if resume:
            core = strata.OffloadedOptimizer.resume(self.store, self.rule,
                                                    key_prefix=self.key_prefix, **pipeline)
            self.table.core = core
            self.read_legacy_empty_steps()
            return core
        if overwrite:
            self.remove()
        try:
            core = strata.OffloadedOptimizer.create(
                self.store, self.rule, hyperparams, default_placement=self.tier,
                key_prefix=self.key_prefix, **pipeline)
        except strata.AlreadyExistsError:
            where = f"the store at {path!r}" if path is not None else "store="
            raise strata.AlreadyExistsError(
                f"{who}: {where} already holds an optimizer checkpoint under key_prefix "
                f"{self.key_prefix!r}: pass resume=True to continue from it, overwrite=True "
                "to delete it and start fresh, or another key_prefix") from None
        self.table.core = core
        return core

    def close_core(self, checkpoint: bool) -> Optional[BaseException]:
        """Closes the C++ optimizer (its last checkpoint first when ``checkpoint``).

        :returns: the error of that checkpoint or close (everything is released all the
            same), else None."""
        core, self.table.core = self.table.core, None
        try:
            core.close(checkpoint=checkpoint)
        except Exception as e:  # noqa: BLE001 (the optimizer raises it after the release)
            return e
        return None

    def load(self, state_dict: Dict[str, Any], param_groups: List[Dict[str, Any]],
             registry: Any, state: Any) -> None:
        """load_state_dict after the optimizer synced its parameters: everything checked
        before anything is written; the groups' hyperparameters replaced (undone if strata
        refuses one), then every parameter's tensors written.

        :param registry: the optimizer's ParamRegistry (pushes hyperparameters).
        :param state: its StateView (invalidated).
        """
        groups = state_dict["param_groups"]
        new_groups = self.check_loaded_groups(groups, param_groups,
                                              [registry.amsgrad()] * len(groups))
        saved_ids = [sid for g in groups for sid in g["params"]]
        self.check_loaded_states(state_dict["state"], saved_ids)
        old_groups = [dict(g) for g in param_groups]
        for ours, merged in zip(param_groups, new_groups):
            params = ours["params"]
            ours.clear()
            ours.update(merged, params=params)
        try:
            registry.sync_hyperparams(param_groups)
        except BaseException:
            for ours, old in zip(param_groups, old_groups):
                ours.clear()
                ours.update(old)
            registry.sync_hyperparams(param_groups)
            raise
        state.invalidate()
        self.load_states(state_dict["state"], saved_ids)
        for h, p in self.table.kept():  # as torch: state replaced whole, theirs dropped
            if self.table.core.step_count(h) > 0:
                self.restart(h, p)

    def restart(self, h: int, p: torch.Tensor) -> None:
        """Handle ``h`` (parameter ``p``) restarts: zero moments, step 0 (its master is
        taken from ``p`` when it steps again)."""
        core = self.table.core
        zeros = np.zeros(state_numel(p), dtype=np.float32)
        for k in range(core.num_states()):
            core.write_state(h, k, zeros)
        core.set_step_count(h, 0)
        self.table.forget(h)

    def remove(self) -> None:
        """overwrite=True: deletes the optimizer checkpointed under ``key_prefix`` (its
        record, its objects, an earlier version's zero-size step counts), if any."""
        try:
            strata.OffloadedOptimizer.remove(self.store, key_prefix=self.key_prefix)
        except strata.NotFoundError:
            pass
        if self._legacy_empty_steps_key in self.store:
            self.store.delete(self._legacy_empty_steps_key)

    def read_legacy_empty_steps(self) -> None:
        """resume: ``legacy_empty_steps`` = {parameter index: step count} of an earlier
        version's zero-size parameters, None when the store has no such object."""
        key = self._legacy_empty_steps_key
        if key not in self.store:
            return
        rows = self.store.get(key)
        if rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != 2:
            raise ValueError(f"checkpoint object '{key}' has dtype {rows.dtype} shape "
                             f"{rows.shape}, expected int64 (n, 2)")
        self.legacy_empty_steps = {int(i): int(n) for i, n in rows}

    def add_legacy_empty_param(self, name: str, index: int, group: int) -> int:
        """resume: zero-size parameter ``index`` that the checkpoint of an earlier version
        did not hold, added with the step count that version saved (0 without one)."""
        h = self.table.core.add_param(name, 0, None, group=group, placement=self.tier)
        self.table.core.set_step_count(h, (self.legacy_empty_steps or {}).get(index, 0))
        return h

    def finish_legacy_resume(self, resume_handles: Dict[int, Optional[int]]) -> None:
        """resume, after registering the parameters: a checkpoint of an earlier version
        becomes one of this version -- one commit that holds the zero-size parameters added
        by _add_legacy_empty_param (nothing has stepped: the same state), then the separate
        object of their counts is deleted (a crash in between leaves it, ignored: the
        commit holds them)."""
        if any(h is None for h in resume_handles.values()):
            self.table.core.checkpoint()
        if self.legacy_empty_steps is not None:
            self.store.delete(self._legacy_empty_steps_key)
            self.legacy_empty_steps = None

    def check_layout(self, param_groups: List[Dict[str, Any]], names_by_id: Dict[int, str]
                     ) -> Dict[int, Optional[int]]:
        """resume: the model's groups, parameter count and sizes must be the checkpoint's.

        :returns: parameter index -> its handle in the checkpoint; None for a zero-size
            parameter that a checkpoint of an earlier version does not hold (it kept their
            step counts in ``legacy_empty_steps``, or, earlier still, nowhere).
        """
        n_groups = self.table.core.num_param_groups()
        if len(param_groups) != n_groups:
            raise ValueError(
                f"the checkpoint under '{self.key_prefix}' has {n_groups} param group(s), "
                f"the optimizer was given {len(param_groups)}; give the parameters in "
                "the checkpoint's groups")
        params = [(gi, p) for gi, g in enumerate(param_groups) for p in g["params"]]
        found = _names.checkpoint_handles(
            self.table.core, {i: names_by_id.get(id(p)) for i, (_, p) in enumerate(params)},
            self.key_prefix)
        handles: Dict[int, Optional[int]] = {i: found.get(i) for i in range(len(params))}
        legacy = self.legacy_empty_steps
        # an earlier version's checkpoint holds zero-size parameters outside strata
        outside = {i for i in (legacy or {}) if handles.get(i) is None}
        held = self.table.core.num_params() + len(outside)
        given = len(params)
        # earlier still, their counts were not saved: the model's may be absent
        uncounted = legacy is None and all(self.table.core.param_info(h)["numel"] > 0
                                           for h in range(self.table.core.num_params()))
        if uncounted:
            given -= sum(1 for i, (_, p) in enumerate(params)
                         if handles[i] is None and p.numel() == 0)
        if held != given:
            raise ValueError(f"the checkpoint under '{self.key_prefix}' holds {held} "
                             f"parameters, the model gives {given}")
        # every parameter before any master is copied into the model
        for i, (gi, p) in enumerate(params):
            name, h = f"p{i}", handles[i]
            if h is not None:
                info = self.table.core.param_info(h)
                numel, group = info["numel"], info["group"]
            elif i in outside:
                numel, group = 0, gi
            elif uncounted and p.numel() == 0:
                continue
            else:
                raise ValueError(f"the checkpoint under '{self.key_prefix}' has no "
                                 f"parameter {name}")
            if numel != state_numel(p):
                raise ValueError(f"checkpointed parameter {name} has {numel} elements, the "
                                 f"model's has {state_numel(p)}"
                                 + _world_size_hint(numel, p.numel(), state_numel(p)))
            if group != gi:
                raise ValueError(f"checkpointed parameter {name} is in param group "
                                 f"{group}, the model gives it in group {gi}")
        return handles

    # ---- state dicts -------------------------------------------------------------------------

    def state_dict(self, param_groups: List[Dict[str, Any]]) -> Dict[str, Any]:
        """torch.optim.Adam's state dict of the state in ``table.core`` (see the optimizer's
        state_dict(): the caller takes changed parameters and optimizer.state edits
        first)."""
        core = self.table.core
        state: Dict[int, Dict[str, Any]] = {}
        names = self.table.state_names()
        index: Dict[int, int] = {}
        groups = []
        start = 0
        for group in param_groups:
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index[id(p)] for p in group["params"]]
            start += len(group["params"])
            groups.append(g)
        for h, p in list(self.table.known()):
            if id(p) not in index and core.step_count(h) > 0:
                raise KeyError(
                    f"state_dict(): parameter '{core.param_info(h)['name']}' (shape "
                    f"{tuple(p.shape)}) has optimizer state but is in no param group, so "
                    "it has no number (torch.optim.Optimizer.state_dict raises KeyError for "
                    "it too): put it back into a group, or del optimizer.state[p]")
        for group in param_groups:
            for p in group["params"]:
                h = self.table.handle_of(p)
                i = index[id(p)]
                if h is None or i in state or core.step_count(h) == 0:
                    continue
                st: Dict[str, Any] = {"step": torch.tensor(float(core.step_count(h)))}
                for k, name in enumerate(names):
                    st[name] = torch.from_numpy(core.read_state(h, k)).view(p.shape)
                if p.dtype != torch.float32:
                    st["master_param"] = torch.from_numpy(core.read_param(h)).view(p.shape)
                state[i] = st
        return {"state": state, "param_groups": groups}

    def check_loaded_groups(self, groups: Any, param_groups: List[Dict[str, Any]],
                            amsgrad: List[bool]) -> list:
        """load_state_dict: the saved groups merged over ours, all checked (nothing set).
        ``amsgrad``: per group, what strata's state streams were made with."""
        if len(groups) != len(param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(param_groups, groups):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        new_groups = []
        for gi, saved in enumerate(groups):
            where = f"loaded param group {gi}: "
            merged = copy.deepcopy({k: v for k, v in saved.items() if k != "params"})
            for k, v in self.flags.group_defaults().items():
                merged.setdefault(k, v)
            for k in ("lr", "betas", "eps", "weight_decay"):
                if k not in merged:
                    raise ValueError(f"{where}has no '{k}' (torch.optim would fail at the "
                                     "next step)")
            _hyperparams.check(self.rule, merged, where, any_betas=True)
            self.flags.check(merged, where)
            _hyperparams.check_amsgrad(merged, amsgrad[gi], where)
            new_groups.append(merged)
        return new_groups

    def check_loaded_states(self, states: Dict[Any, Any], saved_ids: list) -> None:
        """load_state_dict: every saved state entry fits its parameter (nothing set)."""
        names = self.table.state_names()
        for sid, p in zip(saved_ids, self.table.params):
            st = states.get(sid)
            if st is None:
                continue
            if "step" not in st:
                raise ValueError(f"loaded state of parameter {sid} has no 'step'")
            step = _step_value(st["step"])
            if not (math.isfinite(step) and step >= 0 and step == int(step)):
                raise ValueError(f"loaded state of parameter {sid}: step {step} is not an "
                                 "integer >= 0")
            for name in names + ["master_param"]:
                if name in st and _numel(st[name]) != state_numel(p):
                    raise ValueError(f"loaded state of parameter {sid}: '{name}' has "
                                     f"{_numel(st[name])} elements, the parameter has "
                                     f"{state_numel(p)}")

    def load_states(self, states: Dict[Any, Any], saved_ids: list) -> None:
        """load_state_dict: every parameter's master, states and step from its saved entry
        (checked by check_loaded_states; no entry restarts it)."""
        names = self.table.state_names()
        core, table = self.table.core, self.table
        for sid, p in zip(saved_ids, table.params):
            st = states.get(sid)
            h = table.handle[id(p)]
            master = (st or {}).get("master_param", p.detach())
            core.write_param(h, as_f32_numpy(master))
            zeros = np.zeros(state_numel(p), dtype=np.float32)
            for k, name in enumerate(names):
                # absent (e.g. a torch state dict before its first step, or no entry): zeros
                core.write_state(h, k, as_f32_numpy(st[name]) if st and name in st else zeros)
            core.set_step_count(h, 0 if st is None else int(_step_value(st["step"])))
            table.mark(h)
