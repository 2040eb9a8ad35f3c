"""Durability and state dicts of strata.torch's optimizers: checkpoint(), the layout checks
of a resume, state_dict() and load_state_dict() in torch.optim.Adam's format.

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict

import numpy as np
import torch

from . import _hyperparams
from ._staging import as_f32_numpy


def _numel(t: Any) -> int:
    return t.numel() if torch.is_tensor(t) else int(np.asarray(t).size)


def _step_value(step: Any) -> float:
    return float(step.item() if torch.is_tensor(step) else step)


class StateDictMixin:
    """checkpoint / state_dict / load_state_dict of ``_OffloadAdamBase``. Uses its
    ``_opt`` (strata.OffloadedOptimizer), ``store``, ``_key_prefix``, ``_params`` (in
    registration order), ``_handle`` (id(param) -> strata handle, None for zero-size
    parameters), ``_empty_steps`` / ``_saved_empty_steps`` (their step counts), ``_pushed``,
    ``_check_open`` and ``_sync_hyperparams``."""

    # ---- checkpoint, resume ----------------------------------------------------------------

    @property
    def _empty_steps_key(self) -> str:
        return self._key_prefix + "torch/empty_steps"

    def checkpoint(self) -> None:
        """Makes the state after the last step durable in place (one store flush); reopen
        with ``resume=True`` and the same store/path and key_prefix.

        The step counts of zero-size parameters (which strata does not hold) are written
        first, as the int64 object ``<key_prefix>torch/empty_steps`` of shape (n, 2): rows
        (parameter index, step count), n = number of zero-size parameters (may be 0)."""
        self._check_open()
        rows = [(i, self._empty_steps[id(p)]) for i, p in enumerate(self._params)
                if self._handle[id(p)] is None]
        self.store.put(self._empty_steps_key, np.array(rows, dtype=np.int64).reshape(-1, 2),
                       overwrite=True)
        self._opt.checkpoint()

    def _read_empty_steps(self) -> Dict[int, int]:
        """{parameter index: step count} of the zero-size parameters of the checkpoint ({}
        for a checkpoint written before these counts were saved)."""
        if self._empty_steps_key not in self.store:
            return {}
        rows = self.store.get(self._empty_steps_key)
        if rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != 2:
            raise ValueError(f"checkpoint object '{self._empty_steps_key}' has dtype "
                             f"{rows.dtype} shape {rows.shape}, expected int64 (n, 2)")
        return {int(i): int(n) for i, n in rows}

    def _check_checkpoint_layout(self) -> None:
        """resume: the model's groups and parameter count must be the checkpoint's."""
        n_groups = self._opt.num_param_groups()
        if len(self.param_groups) != n_groups:
            raise ValueError(
                f"the checkpoint under '{self._key_prefix}' has {n_groups} param group(s), "
                f"the optimizer was given {len(self.param_groups)}; give the parameters in "
                "the checkpoint's groups")
        params = [p for g in self.param_groups for p in g["params"]]
        has_empty_rows = self._empty_steps_key in self.store
        if has_empty_rows:
            held, given = self._opt.num_params() + len(self._saved_empty_steps), len(params)
        else:  # a checkpoint without zero-size counts: compare the non-empty parameters
            held, given = self._opt.num_params(), sum(1 for p in params if p.numel() > 0)
        if held != given:
            raise ValueError(f"the checkpoint under '{self._key_prefix}' holds {held} "
                             f"parameters, the model gives {given}")
        # every parameter before any master is copied into the model
        i = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name, i = f"p{i}", i + 1
                if p.numel() == 0:
                    if has_empty_rows and i - 1 not in self._saved_empty_steps:
                        n = self._opt.param_info(self._opt.find_param(name))["numel"]
                        raise ValueError(f"checkpointed parameter {name} has {n} elements, "
                                         "the model's has 0")
                    continue
                if int(name[1:]) in self._saved_empty_steps:
                    raise ValueError(f"checkpointed parameter {name} has 0 elements, the "
                                     f"model's has {p.numel()}")
                info = self._opt.param_info(self._opt.find_param(name))
                if info["numel"] != p.numel():
                    raise ValueError(f"checkpointed parameter {name} has {info['numel']} "
                                     f"elements, the model's has {p.numel()}")
                if info["group"] != gi:
                    raise ValueError(f"checkpointed parameter {name} is in param group "
                                     f"{info['group']}, the model gives it in group {gi}")

    # ---- state dicts -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """torch.optim.Adam's format: ``state[i]`` has ``step`` (a float tensor),
        ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) as fp32 CPU
        tensors shaped like parameter i; for fp16/bf16 parameters also ``master_param``
        (the fp32 master). It loads into torch.optim.Adam/AdamW and back."""
        self._check_open()
        state: Dict[int, Dict[str, Any]] = {}
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        for i, p in enumerate(self._params):
            h = self._handle[id(p)]
            step = self._empty_steps[id(p)] if h is None else self._opt.step_count(h)
            if step == 0:
                continue
            st: Dict[str, Any] = {"step": torch.tensor(float(step))}
            for k, name in enumerate(names):
                st[name] = (torch.zeros(p.shape, dtype=torch.float32) if h is None else
                            torch.from_numpy(self._opt.read_state(h, k)).view(p.shape))
            if p.dtype != torch.float32:
                st["master_param"] = (torch.zeros(p.shape, dtype=torch.float32) if h is None
                                      else torch.from_numpy(self._opt.read_param(h))
                                      .view(p.shape))
            state[i] = st
        groups = []
        index = 0
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(g)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch.optim.Adam/AdamW (same groups and
        parameter sizes). Masters come from ``master_param`` when present, else from the
        model's current parameters; a parameter without a state entry restarts (zero
        moments, step 0). The saved groups' hyperparameters replace ``param_groups``'.

        Atomic with respect to validation: everything is checked before anything is
        written, so a refused state dict leaves the optimizer exactly as it was.

        :raises ValueError: a different number of groups or of parameters in a group; a
            hyperparameter out of range (naming the group); ``amsgrad`` other than this
            optimizer's (strata's state streams are fixed at creation); a state entry
            without ``step`` or with a step that is not an integer >= 0; a state tensor
            (exp_avg, exp_avg_sq, max_exp_avg_sq, master_param) whose element count is not
            the parameter's (naming the parameter index, the state and both sizes).
        :raises strata.FailedPreconditionError: the optimizer is closed.
        """
        self._check_open()
        groups = state_dict["param_groups"]
        new_groups = self._check_loaded_groups(groups)
        saved_ids = list(itertools.chain.from_iterable(g["params"] for g in groups))
        names = [self._opt.state_name(k) for k in range(self._opt.num_states())]
        self._check_loaded_states(state_dict["state"], saved_ids, names)
        # ---- hyperparameters (undone if strata refuses one), then the tensors ----
        old_groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for ours, merged in zip(self.param_groups, new_groups):
            ours.update(merged)
        try:
            self._sync_hyperparams()
        except BaseException:
            for ours, old in zip(self.param_groups, old_groups):
                for k in list(ours):
                    if k != "params" and k not in old:
                        del ours[k]
                ours.update(old)
            self._sync_hyperparams()
            raise
        for sid, p in zip(saved_ids, self._params):
            self._load_param_state(p, state_dict["state"].get(sid), names)

    def _check_loaded_groups(self, groups: Any) -> list:
        """load_state_dict: the saved groups merged over ours, all checked (nothing set)."""
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(self.param_groups, groups):
            if len(ours["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        new_groups = []
        for gi, (ours, saved) in enumerate(zip(self.param_groups, groups)):
            merged = {k: v for k, v in ours.items() if k != "params"}
            merged.update({k: v for k, v in saved.items() if k != "params"})
            where = f"loaded param group {gi}: "
            _hyperparams.check(self._RULE, merged, where)
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
                if name in st and _numel(st[name]) != p.numel():
                    raise ValueError(f"loaded state of parameter {sid}: '{name}' has "
                                     f"{_numel(st[name])} elements, the parameter has "
                                     f"{p.numel()}")

    def _load_param_state(self, p: torch.nn.Parameter, st: Any, names: list) -> None:
        """load_state_dict: parameter ``p``'s master, states and step from ``st`` (checked;
        None restarts it)."""
        h = self._handle[id(p)]
        if h is None:  # zero-size: only the step count
            self._empty_steps[id(p)] = int(_step_value((st or {}).get("step", 0)))
            return
        master = (st or {}).get("master_param", p.detach())
        self._opt.write_param(h, as_f32_numpy(master))
        zeros = np.zeros(p.numel(), dtype=np.float32)
        for k, name in enumerate(names):
            # absent (e.g. a torch state dict before its first step, or no entry): zeros
            self._opt.write_state(h, k, as_f32_numpy(st[name]) if st and name in st else zeros)
        self._opt.set_step_count(h, 0 if st is None else int(_step_value(st["step"])))
