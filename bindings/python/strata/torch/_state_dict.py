"""Durability and state dicts of strata.torch's optimizers: checkpoint(), the layout checks
of a resume, state_dict() and load_state_dict() in torch.optim.Adam's format.

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Dict, Optional

import numpy as np
import torch

import strata

from . import _hyperparams, _names
from ._staging import as_f32_numpy
from ._offload_step import state_numel


def _numel(t: Any) -> int:
    return t.numel() if torch.is_tensor(t) else int(np.asarray(t).size)


def _step_value(step: Any) -> float:
    return float(step.item() if torch.is_tensor(step) else step)


class StateDictMixin:
    """checkpoint / state_dict / load_state_dict of ``_OffloadAdamBase``. Uses its
    ``_opt`` (strata.OffloadedOptimizer, which holds every parameter, zero-size ones
    included), ``store``, ``_key_prefix``, ``_params`` (in registration order), ``_handle``
    (id(param) -> strata handle), ``_legacy_empty_steps``, ``tier``, ``_pushed``,
    ``_names_by_id`` (id(param) -> the name given with it), ``_check_open`` and
    ``_sync_hyperparams``."""

    # ---- checkpoint, resume ----------------------------------------------------------------

    @property
    def _legacy_empty_steps_key(self) -> str:
        """Where earlier versions, whose strata did not hold zero-size parameters, kept
        their step counts: int64 of shape (n, 2), rows (parameter index, step count)."""
        return self._key_prefix + "torch/empty_steps"

    def checkpoint(self) -> None:
        """Makes the state after the last step durable in place: one commit of the
        optimizer's objects, which holds every parameter's state and step count,
        zero-size parameters' included, and the current ``param_groups``' hyperparameters
        (an lr a scheduler set after the last step included). Parameters changed outside
        the optimizer since the last step are taken as their masters first, and parameters
        added to ``param_groups`` are registered (as at step()). Reopen with
        ``resume=True`` and the same store/path and key_prefix: a resume restores the last
        checkpoint or :meth:`close` (also garbage collection and interpreter exit),
        whatever the tier; a process killed without closing resumes at its last
        checkpoint, even if the store was flushed since.

        :raises ValueError: a param_groups edit strata cannot follow or a hyperparameter
            it cannot hold (as step(); nothing is written).

        :raises strata.FailedPreconditionError: the optimizer is closed, or a step failed
            part-way before (resume from the last checkpoint).
        :raises strata.Error: the store's errors (IoError, ResourceExhausted, ...); the last
            checkpoint then stays the resume point.
        """
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._sync_params()
        self._sync_hyperparams()
        self.state.write_back()
        self._opt.checkpoint()

    def _remove_checkpoint(self) -> None:
        """overwrite=True: deletes the optimizer checkpointed under ``_key_prefix`` (its
        record, its objects, an earlier version's zero-size step counts), if any."""
        try:
            strata.OffloadedOptimizer.remove(self.store, key_prefix=self._key_prefix)
        except strata.NotFoundError:
            pass
        if self._legacy_empty_steps_key in self.store:
            self.store.delete(self._legacy_empty_steps_key)

    def _read_legacy_empty_steps(self) -> Optional[Dict[int, int]]:
        """resume: {parameter index: step count} of an earlier version's zero-size
        parameters, None when the store has no such object."""
        key = self._legacy_empty_steps_key
        if key not in self.store:
            return None
        rows = self.store.get(key)
        if rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != 2:
            raise ValueError(f"checkpoint object '{key}' has dtype {rows.dtype} shape "
                             f"{rows.shape}, expected int64 (n, 2)")
        return {int(i): int(n) for i, n in rows}

    def _add_legacy_empty_param(self, name: str, index: int, group: int) -> int:
        """resume: zero-size parameter ``index`` that the checkpoint of an earlier version
        did not hold, added with the step count that version saved (0 without one)."""
        h = self._opt.add_param(name, 0, None, group=group, placement=self.tier)
        self._opt.set_step_count(h, (self._legacy_empty_steps or {}).get(index, 0))
        return h

    def _finish_legacy_resume(self) -> None:
        """resume, after registering the parameters: a checkpoint of an earlier version
        becomes one of this version -- one commit that holds the zero-size parameters added
        by _add_legacy_empty_param (nothing has stepped: the same state), then the separate
        object of their counts is deleted (a crash in between leaves it, ignored: the
        commit holds them)."""
        if any(h is None for h in self._resume_handles.values()):
            self._opt.checkpoint()
        if self._legacy_empty_steps is not None:
            self.store.delete(self._legacy_empty_steps_key)
            self._legacy_empty_steps = None

    def _check_checkpoint_layout(self) -> Dict[int, Optional[int]]:
        """resume: the model's groups, parameter count and sizes must be the checkpoint's.

        :returns: parameter index -> its handle in the checkpoint; None for a zero-size
            parameter that a checkpoint of an earlier version does not hold (it kept their
            step counts in ``_legacy_empty_steps``, or, earlier still, nowhere).
        """
        n_groups = self._opt.num_param_groups()
        if len(self.param_groups) != n_groups:
            raise ValueError(
                f"the checkpoint under '{self._key_prefix}' has {n_groups} param group(s), "
                f"the optimizer was given {len(self.param_groups)}; give the parameters in "
                "the checkpoint's groups")
        params = [(gi, p) for gi, g in enumerate(self.param_groups) for p in g["params"]]
        found = _names.checkpoint_handles(
            self._opt, {i: self._names_by_id.get(id(p)) for i, (_, p) in enumerate(params)},
            self._key_prefix)
        handles: Dict[int, Optional[int]] = {i: found.get(i) for i in range(len(params))}
        legacy = self._legacy_empty_steps
        # an earlier version's checkpoint holds zero-size parameters outside strata
        outside = {i for i in (legacy or {}) if handles.get(i) is None}
        held = self._opt.num_params() + len(outside)
        given = len(params)
        # earlier still, their counts were not saved: the model's may be absent
        uncounted = legacy is None and all(self._opt.param_info(h)["numel"] > 0
                                           for h in range(self._opt.num_params()))
        if uncounted:
            given -= sum(1 for i, (_, p) in enumerate(params)
                         if handles[i] is None and p.numel() == 0)
        if held != given:
            raise ValueError(f"the checkpoint under '{self._key_prefix}' holds {held} "
                             f"parameters, the model gives {given}")
        # every parameter before any master is copied into the model
        for i, (gi, p) in enumerate(params):
            name, h = f"p{i}", handles[i]
            if h is not None:
                info = self._opt.param_info(h)
                numel, group = info["numel"], info["group"]
            elif i in outside:
                numel, group = 0, gi
            elif uncounted and p.numel() == 0:
                continue
            else:
                raise ValueError(f"the checkpoint under '{self._key_prefix}' has no "
                                 f"parameter {name}")
            if numel != state_numel(p):
                raise ValueError(f"checkpointed parameter {name} has {numel} elements, the "
                                 f"model's has {state_numel(p)}")
            if group != gi:
                raise ValueError(f"checkpointed parameter {name} is in param group "
                                 f"{group}, the model gives it in group {gi}")
        return handles

    # ---- state dicts -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """torch.optim.Adam's format: ``state[i]`` has ``step`` (a float tensor),
        ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) as fp32 CPU
        tensors shaped like parameter i; for fp16/bf16 parameters also ``master_param``
        (the fp32 master). Parameters are numbered as torch.optim.Optimizer.state_dict
        numbers them: by identity, in ``param_groups`` order, a parameter listed again
        keeping its first number (the numbers then skip its later positions). Parameters
        changed outside the optimizer are taken as their masters first. It loads into
        torch.optim.Adam/AdamW and back."""
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._table.take_changed(self._opt)
        self.state.write_back()
        state: Dict[int, Dict[str, Any]] = {}
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        index: Dict[int, int] = {}
        groups = []
        start = 0
        for group in self.param_groups:
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index[id(p)] for p in group["params"]]
            start += len(group["params"])
            groups.append(g)
        for group in self.param_groups:
            for p in group["params"]:
                h = self._handle.get(id(p))
                i = index[id(p)]
                if h is None or i in state or self._opt.step_count(h) == 0:
                    continue
                st: Dict[str, Any] = {"step": torch.tensor(float(self._opt.step_count(h)))}
                for k, name in enumerate(names):
                    st[name] = torch.from_numpy(self._opt.read_state(h, k)).view(p.shape)
                if p.dtype != torch.float32:
                    st["master_param"] = torch.from_numpy(
                        self._opt.read_param(h)).view(p.shape)
                state[i] = st
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch.optim.Adam/AdamW (same groups and
        parameter sizes). Masters come from ``master_param`` when present, else from the
        model's current parameters; a parameter without a state entry restarts (zero
        moments, step 0). Each group becomes the saved one, as in torch: its keys replace
        ``param_groups``' (keys only ours had are dropped), and optional keys it lacks
        (e.g. ``maximize`` in an older checkpoint) take torch's defaults (amsgrad and
        maximize False, foreach None, capturable/differentiable/fused False), not the live
        values. Parameters changed outside the optimizer afterwards (e.g. a
        ``model.load_state_dict`` after this call) are taken at the next step.

        Atomic with respect to validation: everything is checked before anything is
        written, so a refused state dict leaves the optimizer exactly as it was.

        :raises ValueError: a different number of groups or of parameters in a group; a
            saved group without lr, betas, eps or weight_decay (naming the group and key;
            torch would fail at its next step); a hyperparameter out of range (naming the
            group); ``amsgrad`` other than this
            optimizer's (strata's state streams are fixed at creation); a state entry
            without ``step`` or with a step that is not an integer >= 0; a state tensor
            (exp_avg, exp_avg_sq, max_exp_avg_sq, master_param) whose element count is not
            the parameter's (naming the parameter index, the state and both sizes).
        :raises strata.FailedPreconditionError: the optimizer is closed.
        """
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._sync_params()
        groups = state_dict["param_groups"]
        new_groups = self._check_loaded_groups(groups)
        saved_ids = list(itertools.chain.from_iterable(g["params"] for g in groups))
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        self._check_loaded_states(state_dict["state"], saved_ids, names)
        # ---- hyperparameters (undone if strata refuses one), then the tensors ----
        old_groups = [dict(g) for g in self.param_groups]
        for ours, merged in zip(self.param_groups, new_groups):
            params = ours["params"]
            ours.clear()
            ours.update(merged, params=params)
        try:
            self._sync_hyperparams()
        except BaseException:
            for ours, old in zip(self.param_groups, old_groups):
                ours.clear()
                ours.update(old)
            self._sync_hyperparams()
            raise
        self.state.invalidate()
        for sid, p in zip(saved_ids, self._params):
            self._load_param_state(p, state_dict["state"].get(sid), names)
            self._table.mark(self._handle[id(p)])

    def _check_loaded_groups(self, groups: Any) -> list:
        """load_state_dict: the saved groups merged over ours, all checked (nothing set)."""
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(self.param_groups, groups):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        new_groups = []
        for gi, saved in enumerate(groups):
            where = f"loaded param group {gi}: "
            merged = copy.deepcopy({k: v for k, v in saved.items() if k != "params"})
            for k, v in self._group_defaults().items():
                merged.setdefault(k, v)
            for k in ("lr", "betas", "eps", "weight_decay"):
                if k not in merged:
                    raise ValueError(f"{where}has no '{k}' (torch.optim would fail at the "
                                     "next step)")
            _hyperparams.check(self._RULE, merged, where, any_betas=True)
            self._check_torch_flags(merged, where)
            _hyperparams.check_amsgrad(merged, bool(self._pushed[gi]["amsgrad"]), where)
            new_groups.append(merged)
        return new_groups

    def _check_loaded_states(self, states: Dict[Any, Any], saved_ids: list, names: list) -> None:
        """load_state_dict: every saved state entry fits its parameter (nothing set)."""
        for sid, p in zip(saved_ids, self._params):
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

    def _load_param_state(self, p: torch.nn.Parameter, st: Any, names: list) -> None:
        """load_state_dict: parameter ``p``'s master, states and step from ``st`` (checked;
        None restarts it)."""
        h = self._handle[id(p)]
        master = (st or {}).get("master_param", p.detach())
        self._opt.write_param(h, as_f32_numpy(master))
        zeros = np.zeros(state_numel(p), dtype=np.float32)
        for k, name in enumerate(names):
            # absent (e.g. a torch state dict before its first step, or no entry): zeros
            self._opt.write_state(h, k, as_f32_numpy(st[name]) if st and name in st else zeros)
        self._opt.set_step_count(h, 0 if st is None else int(_step_value(st["step"])))
