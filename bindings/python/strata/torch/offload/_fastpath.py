"""torch's fused fast paths over offloaded parameters: ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` take a fused kernel in eval
with grad disabled (``torch.no_grad()``, ``torch.inference_mode()``), but skip it when an
argument has ``__torch_function__`` (``torch.overrides.has_torch_function``), which an
:class:`OffloadedParameter` has: their numbers would then differ from in-memory torch's
(by float rounding). A forward pre-hook on each such module of the model materializes the
parameters the fast path checks, together, pins them against eviction and presents them
as plain ``torch.nn.Parameter`` objects for that forward (the same objects: in-place edits
are seen); the forward hook undoes it. Where torch has ``always_call`` (2.1 and later) the
undo also runs when the forward raises; on older torch, parameters left presented by a
raised forward are undone at the next forward of the model, release_all (a strata step),
checkpoint or close (meanwhile they are plain parameters holding their current values,
in memory).

Registry: :data:`FAST_PATHS` maps a module type to the parameters its fast path checks
(instances of subclasses match too); :func:`register_fast_path` adds one (before
offload_parameters / attach).

Thread-safety: one thread at a time (torch's forward thread), as ParameterOffload.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from ._parameter import present_offloaded, present_plain, record_of
from ._record import ParamRecord


def _own(m: torch.nn.Module) -> Iterable[Any]:
    return m.parameters()


def _first_layer(m: torch.nn.Module) -> Iterable[Any]:
    # TransformerEncoder checks its first layer's parameters (then calls every layer,
    # whose own hooks present theirs)
    layers = getattr(m, "layers", None)
    return layers[0].parameters() if layers is not None and len(layers) else ()


#: module type -> the parameters its fast path checks (presented plain for its forward)
FAST_PATHS: Dict[type, Callable[[torch.nn.Module], Iterable[Any]]] = {
    torch.nn.MultiheadAttention: _own,
    torch.nn.TransformerEncoderLayer: _own,
    torch.nn.TransformerEncoder: _first_layer,
}


def register_fast_path(module_type: type,
                       parameters_of: Callable[[torch.nn.Module], Iterable[Any]]) -> None:
    """Registers a module type with a fast path that skips ``__torch_function__``
    arguments. ``parameters_of(module)`` returns the parameters (None entries allowed) to
    present plain during that module's eval forwards without grad. Affects models attached
    afterwards. Not thread-safe (a process-wide table).

    :raises TypeError: ``module_type`` is not a torch.nn.Module subclass, or
        ``parameters_of`` is not callable."""
    if not (isinstance(module_type, type) and issubclass(module_type, torch.nn.Module)):
        raise TypeError(f"register_fast_path: module_type must be a torch.nn.Module subclass, "
                        f"got {module_type!r}")
    if not callable(parameters_of):
        raise TypeError(f"register_fast_path: parameters_of must be callable, got "
                        f"{parameters_of!r}")
    FAST_PATHS[module_type] = parameters_of


def parameters_of(module: torch.nn.Module) -> Optional[Callable[[torch.nn.Module], Iterable[Any]]]:
    """The registry's entry for ``module`` (its type or a base), None when it has none."""
    for cls in type(module).__mro__:
        fn = FAST_PATHS.get(cls)
        if fn is not None:
            return fn
    return None


def _has_always_call() -> bool:
    try:
        return "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters
    except (TypeError, ValueError):
        return False


#: torch runs forward hooks registered with always_call=True also when forward raises
ALWAYS_CALL = _has_always_call()


class FastPaths:
    """The presented parameters of one ParameterOffload's fast-path forwards (a stack: a
    TransformerEncoder's entry, then its layers'). ``owner``: the ParameterOffload."""

    def __init__(self, owner: Any):
        self.owner = owner
        #: (id of the module, its presented records) per fast-path forward in progress
        self._active: List[Tuple[int, List[ParamRecord]]] = []

    def begin(self, module: torch.nn.Module, inputs: Any) -> None:
        """A registered module's forward pre-hook (see the module doc)."""
        if module.training or torch.is_grad_enabled():
            return
        fn = parameters_of(module)
        records = []
        for p in (fn(module) if fn is not None else ()):
            s = record_of(p)
            if s is not None and s.owner is self.owner and s not in records:
                records.append(s)
        if not records:
            return
        ws = self.owner.ws
        ws.materialize_together(records)
        ws.protected = ws.protected | {s.index for s in records}
        self._active.append((id(module), records))
        for s in records:
            present_plain(s.param)

    def end(self, module: torch.nn.Module, inputs: Any, output: Any = None) -> None:
        """A registered module's forward hook: undoes its begin."""
        if self._active and self._active[-1][0] == id(module):
            self._undo(self._active.pop()[1])

    def restore_stale(self) -> None:
        """Undoes every presentation left by a forward that raised (torch without
        always_call): called where no fast-path forward can be in progress."""
        while self._active:
            self._undo(self._active.pop()[1])

    def _undo(self, records: List[ParamRecord]) -> None:
        ws = self.owner.ws
        for s in records:
            present_offloaded(s.param)
        ws.protected = ws.protected - {s.index for s in records}
