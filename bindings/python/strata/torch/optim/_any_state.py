"""What OffloadOptimizer (optim/_any.py) keeps of a torch optimizer's state outside strata's
state streams: ``optimizer.state`` (a read-only mapping parameter -> its state as the
torch.optim class keeps it, read from the store at each access), and the record of the
param groups' hyperparameters and per-tensor scalars that checkpoints commit (JSON bytes,
length-prefixed, in an internal fp32 tensor); and the optimizer's callables held by others
(the Python rule's update, ``optimizer.state``'s reads) through weak references.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

from . import _slice_step as ss


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return float(v.item()) if isinstance(v, torch.Tensor) else v


def encode_record(kind: str, groups: List[Dict[str, Any]],
                  scalars: Dict[int, Dict[str, Any]]) -> bytes:
    """The record's bytes: 8-byte little-endian length, the JSON of (version, kind, each
    group's hyperparameters, each handle's scalar state), zero-padded to a multiple of 4."""
    rec = dict(version=1, kind=kind,
               groups=[{k: _jsonable(v) for k, v in g.items() if k != "params"} for g in groups],
               scalars={str(h): ss.scalars_to_record(s) for h, s in scalars.items()})
    body = json.dumps(rec).encode()
    raw = len(body).to_bytes(8, "little") + body
    return raw + b"\0" * (-len(raw) % 4)


def as_floats(raw: bytes, numel: int) -> np.ndarray:
    """``raw`` in an fp32 array of ``numel`` elements (the rest zeros), bit for bit."""
    buf = np.zeros(numel, dtype=np.float32)
    buf.view(np.uint8)[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return buf


def decode_record(values: np.ndarray) -> Dict[str, Any]:
    """The record (a dict: version, kind, groups, scalars) from its fp32 tensor."""
    raw = values.tobytes()
    return json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")].decode())


class AnyStateView(Mapping):
    """``opt.state[p]``: a new dict of p's state (the class's scalars, e.g. ``step``, and
    its state tensors, fp32 CPU copies shaped like p) read from the store; ``{}`` for a
    parameter of the optimizer without state yet (as torch's defaultdict), KeyError for
    another tensor. Copies: editing them changes nothing (``load_state_dict`` does).

    :param entry: p -> its state dict, or None when p has none; raises KeyError for a
        tensor the optimizer does not hold.
    :param with_state: the parameters that have state, in param_groups order."""

    def __init__(self, entry: Callable[[torch.Tensor], Optional[Dict[str, Any]]],
                 with_state: Callable[[], List[torch.Tensor]]):
        self._entry = entry
        self._with_state = with_state

    def __getitem__(self, p: torch.Tensor) -> Dict[str, Any]:
        e = self._entry(p)
        return {} if e is None else e

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._with_state())

    def __len__(self) -> int:
        return len(self._with_state())

    def __contains__(self, p: object) -> bool:
        return any(q is p for q in self._with_state())


def weak_method(opt: Any, method: str) -> Callable[..., Any]:
    """``opt.<method>`` through a weak reference (``optimizer.state`` holds it)."""
    ref = weakref.ref(opt)
    return lambda *a: getattr(ref(), method)(*a)


def weak_callback(opt: Any) -> Callable[..., None]:
    """The Python rule's callable: ``opt._update_slice`` through a weak reference (the C++
    optimizer holds the callable; ``del opt`` still closes it)."""
    ref = weakref.ref(opt)

    def update(param, grad, states, step, hp, ctx):
        o = ref()
        if o is None:
            raise RuntimeError("the OffloadOptimizer is gone")
        o._update_slice(param, grad, states, step, hp, ctx)
    return update
