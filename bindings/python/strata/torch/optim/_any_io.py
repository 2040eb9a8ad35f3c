"""The state-dict and checkpoint methods of OffloadOptimizer (optim/_any.py), a mixin over
its members: ``optimizer.state`` entries read from the store, ``state_dict()`` /
``load_state_dict()`` in the class's own format, ``checkpoint()`` with the JSON record of
param_groups and the per-tensor scalar state.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from . import _slice_step as ss
from ._any_state import as_floats, encode_record

_RECORD = "torch-record-"  #: name prefix of the record tensors in the C++ optimizer


def master_numpy(p: torch.Tensor) -> np.ndarray:
    """``p``'s value as its fp32 master: a flat fp32 numpy array (p itself for a contiguous
    fp32 CPU tensor; fp16/bf16 widened exactly)."""
    return p.detach().to(torch.float32).reshape(-1).contiguous().numpy()


class AnyCheckpointMethods:
    """OffloadOptimizer's state-dict and checkpoint methods (it defines ``_check_open``,
    ``_core``, ``_by_handle``, ``_scalars`` and the members used here)."""

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

    def state_dict(self) -> Dict[str, Any]:
        """The class's state_dict format (``state[i]``: its scalars and its state tensors,
        fp32 CPU, shaped like parameter i; ``param_groups``), read from the store; loads
        into the class in memory and back."""
        self._check_open()
        self._take_changed()
        saved = self.state
        self.state = defaultdict(dict, {p: self._entry(p) for p in self._with_state()})
        try:
            return super().state_dict()
        finally:
            self.state = saved

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this optimizer or of the class in memory (same groups and
        sizes; torch's checks): its param_groups replace the live ones, each parameter's
        state is written into the store (a parameter without an entry restarts).

        :raises ValueError: torch's checks, or a state tensor the optimizer does not keep
            or of another size (nothing is written then)."""
        self._check_open()
        saved = (self.param_groups, self.state)
        super().load_state_dict(state_dict)
        loaded, self.state = self.state, saved[1]
        plan = []
        try:
            for h, p in self._by_handle.items():
                st = loaded.get(p)
                streams, scalars = ss.split_state(st) if st else ({}, None)
                for n, t in streams.items():
                    if n not in self._streams or t.numel() != p.numel():
                        raise ValueError(f"OffloadOptimizer.load_state_dict: state {n!r} of "
                                         f"parameter {h} ({t.numel()} elements) is not one "
                                         f"this optimizer keeps ({ss.names(self._streams)}, "
                                         f"{p.numel()} elements)")
                plan.append((h, streams, scalars))
        except BaseException:
            self.param_groups = saved[0]
            raise
        core = self._core
        for h, streams, scalars in plan:
            numel = self._by_handle[h].numel()
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
        for h, p in self._by_handle.items():
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
