"""The state-dict and checkpoint methods of OffloadOptimizer (optim/_any.py), a mixin over
its members: ``optimizer.state`` entries read from the store, ``state_dict()`` /
``load_state_dict()`` in the class's own format, ``checkpoint()`` with the JSON record of
param_groups and the per-tensor scalar state.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..offload import is_offloaded
from . import _any_offloaded as aof
from . import _slice_step as ss
from ._any_state import as_floats, encode_record
from ._exchange import bump_version
from ._optimizer_io import refuse_copy

_RECORD = "torch-record-"  #: name prefix of the record tensors in the C++ optimizer


def master_numpy(p: torch.Tensor) -> np.ndarray:
    """``p``'s value as its fp32 master: a flat fp32 numpy array (p itself for a contiguous
    fp32 CPU tensor; fp16/bf16 widened exactly)."""
    return p.detach().to(torch.float32).reshape(-1).contiguous().numpy()


class AnyCheckpointMethods:
    """OffloadOptimizer's state-dict and checkpoint methods (it defines ``_check_open``,
    ``_core``, ``_by_handle``, ``_scalars`` and the members used here)."""

    __copy__ = refuse_copy
    __deepcopy__ = refuse_copy

    # ---- state dicts, checkpoints --------------------------------------------------------

    def _entry(self, p: torch.Tensor) -> Optional[Dict[str, Any]]:
        """p's state as the class keeps it (read from the store), None: none yet."""
        self._check_open()
        h = self._handle.get(id(p))
        if h is None or self._by_handle[h] is not p:
            raise KeyError("OffloadOptimizer.state: the tensor is not one of its parameters")
        if h not in self._scalars:
            initial = self._initial.get(id(p))
            return None if initial is None else ss.expand_state(initial, p)
        entry = ss.clone_scalars(self._scalars[h])
        for n in self._group_streams(self.param_groups[self._group_of[h]]):
            arr = self._core.read_state(h, self._streams.index(n))
            entry[n] = torch.from_numpy(arr).view(p.shape)
        return entry

    def _with_state(self) -> List[torch.Tensor]:
        return [p for h, p in self._by_handle.items()
                if h in self._scalars or id(p) in self._initial]

    def _entry_with_master(self, p: torch.Tensor) -> Dict[str, Any]:
        """state_dict()'s entry of ``p``: :meth:`_entry`, and for an fp16/bf16 ``p`` its fp32
        master as ``master_param`` (as OffloadAdam's state_dict)."""
        entry = self._entry(p) or {}
        if p.dtype != torch.float32:
            entry["master_param"] = torch.from_numpy(
                self._core.read_param(self._handle[id(p)])).view(p.shape)
        return entry

    def state_dict(self) -> Dict[str, Any]:
        """The class's state_dict format (``state[i]``: its scalars and its state tensors,
        fp32 CPU, shaped like parameter i; for an fp16/bf16 parameter also
        ``master_param``, its fp32 master, as OffloadAdam's; ``param_groups``), read from
        the store; loads into the class in memory (which ignores ``master_param``) and
        back."""
        self._check_open()
        self._take_changed()
        saved = self.state
        self.state = defaultdict(dict, {p: self._entry_with_master(p)
                                        for p in self._with_state()})
        try:
            return super().state_dict()
        finally:
            self.state = saved

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this optimizer or of the class in memory (same groups and
        sizes; torch's checks): its param_groups replace the live ones, each parameter's
        state is written into the store, bit for bit (fp32; not cast to an fp16/bf16
        parameter's dtype as torch's load would), a parameter without an entry restarts.
        fp32 masters: an fp16/bf16 parameter's from its ``master_param`` when present,
        else the parameter's current value (as OffloadAdam's load_state_dict); an fp32
        parameter's ``master_param``, when given, also becomes its value.

        :raises ValueError: torch's checks, or a state tensor the optimizer does not keep
            or of another size, or a ``master_param`` of another size (naming the
            parameter; nothing is written then)."""
        self._check_open()
        self._take_changed()  # (a model.load_state_dict before: its values, the masters)
        saved = (self.param_groups, self.state)
        super().load_state_dict(state_dict)
        self.state = saved[1]
        # the entries as given (torch's load casts them to an fp16/bf16 parameter's dtype)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        given = dict(zip((id(p) for p in self._params), ids))
        plan = []
        try:
            for h, p in self._by_handle.items():
                st = state_dict["state"].get(given.get(id(p)))
                streams, scalars = (ss.split_state(st) if st else ({}, None))
                master = streams.pop("master_param", None)
                if (not is_offloaded(p) and self._seen[h][0] != p.data_ptr()
                        and not p.is_contiguous()):
                    raise ValueError(f"OffloadOptimizer: parameter {h} is no longer "
                                     "contiguous")
                if master is not None and master.numel() != p.numel():
                    raise ValueError(f"OffloadOptimizer.load_state_dict: master_param of "
                                     f"parameter {h} has {master.numel()} elements, the "
                                     f"parameter {p.numel()}")
                for n, t in streams.items():
                    if n not in self._streams or t.numel() != p.numel():
                        raise ValueError(f"OffloadOptimizer.load_state_dict: state {n!r} of "
                                         f"parameter {h} ({t.numel()} elements) is not one "
                                         f"this optimizer keeps ({ss.names(self._streams)}, "
                                         f"{p.numel()} elements)")
                plan.append((h, streams, None if scalars is None else
                             ss.clone_scalars(scalars), master))
        except BaseException:
            self.param_groups = saved[0]
            raise
        core = self._core
        for h, streams, scalars, master in plan:
            p = self._by_handle[h]
            if is_offloaded(p):  # the stored value (already the master unless given)
                if master is not None or p.dtype != torch.float32:
                    aof.load_master(core, h, p, master)
                self._seen[h] = self._signature(p)
            elif master is not None or p.dtype != torch.float32:
                if self._seen[h][0] != p.data_ptr():  # p.data = t: the step writes t now
                    core.set_param_copy(h, p.detach().view(-1))
                core.write_param(h, master_numpy(p if master is None else master))
                if p.dtype == torch.float32:
                    self._master_into(h, p)
                    bump_version(p)
                self._seen[h] = self._signature(p)
            numel = p.numel()
            for k, n in enumerate(self._streams):
                t = streams.get(n)
                src = (t.detach().to(torch.float32).reshape(-1).contiguous().numpy()
                       if t is not None else np.zeros(numel, dtype=np.float32))
                core.write_state(h, k, src)
            if scalars is None:
                self._scalars.pop(h, None)
                core.set_step_count(h, 0)
            else:
                self._scalars[h] = scalars
                step = scalars.get("step", 1)
                core.set_step_count(h, max(1, int(float(step))))

    def _take_changed(self) -> None:
        aof.take_changed(self._core, list(self._by_handle.items()), self._seen)
        for h, p in self._by_handle.items():
            if is_offloaded(p):
                continue
            if self._seen[h] != self._signature(p) and self._seen[h][0] == p.data_ptr():
                self._core.write_param(h, master_numpy(p))
                self._seen[h] = self._signature(p)

    def _write_record(self) -> None:
        raw = encode_record(self._kind, self.param_groups, self._scalars)
        core = self._core
        h = self._record_handle
        if h is None or core.param_info(h)["numel"] * 4 < len(raw):
            numel = max(1024, len(raw) // 2)  # twice the bytes, in floats
            h = core.add_param(f"{_RECORD}{core.num_params()}", numel)
            self._record_handle = h
        core.write_param(h, as_floats(raw, core.param_info(h)["numel"]))

    def checkpoint(self) -> None:
        """Makes the state after the last step durable (one commit: every tensor's state,
        the step counts, the per-tensor scalars and the current param_groups'
        hyperparameters). Reopen with ``resume=True`` (also after a kill without close)."""
        self._check_open()
        self._take_changed()
        self._write_record()
        self._core.checkpoint()
