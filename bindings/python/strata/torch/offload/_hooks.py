"""The hooks parameter offload puts on a model (its forward pre-hook and hook, which start
and end the working set's phases; the fast-path hooks of offload/_fastpath.py) as objects that copies and pickles of the model understand:

* ``copy.deepcopy(model)`` copies each hook bound to the copy's own ParameterOffload (made
  by offload/_copy.py for that deepcopy, found in its memo), so the copy's forwards drive
  the copy's working set;
* pickling (``torch.save(model)``) writes each hook as a no-op function
  (:func:`dropped_hook`): the unpickled model is an ordinary one (its parameters plain ``torch.nn.Parameter`` objects).

A ParameterOffload removes its hooks at close by looking them up in the modules it hooked
(``ParameterOffload.hooked_modules``), whether it installed them or a deepcopy did.

Thread-safety: one thread at a time (torch's forward thread), as ParameterOffload.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from ._fastpath import ALWAYS_CALL, parameters_of


def dropped_hook(*args: Any) -> None:
    """What a pickled strata hook becomes: a hook that does nothing (returns None)."""
    return None


def _dropped() -> Callable[..., None]:
    return dropped_hook


class HandleHook:
    """A module hook calling ParameterOffload ``handle``'s member ``name`` (dotted: a
    member's method, e.g. ``"fast.begin"``) with the hook's arguments; ``module`` is the
    module it is registered on (weakly held)."""

    __slots__ = ("handle", "name", "module")

    def __init__(self, handle: Any, name: str, module: torch.nn.Module):
        self.handle = handle
        self.name = name
        self.module = weakref.ref(module)

    def __call__(self, *args: Any) -> Any:
        target = self.handle
        for part in self.name.split("."):
            target = getattr(target, part)
        return target(*args)

    def __deepcopy__(self, memo: dict) -> "HandleHook":
        from ._copy import copy_handle  # (offload/_copy.py imports this module)
        c = copy_handle(self.handle, memo)
        src = self.module()
        dst = memo.get(id(src)) if src is not None else None
        if dst is None:  # the hook copied without its module: nothing to drive
            return HandleHook(c, self.name, src if src is not None else torch.nn.Module())
        if not any(r() is dst for r in c.hooked_modules):
            c.hooked_modules.append(weakref.ref(dst))
        if self.name == "_forward_begin" and src is self.handle._model:
            c._model = dst
        return HandleHook(c, self.name, dst)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_dropped, ())


def install_model_hooks(handle: Any, model: torch.nn.Module) -> None:
    """The hooks of an attached model: ``handle._forward_begin`` / ``_forward_end`` on the
    model, and the fast-path hooks (offload/_fastpath.py) on each of its modules that the
    registry names."""
    model.register_forward_pre_hook(HandleHook(handle, "_forward_begin", model))
    model.register_forward_hook(HandleHook(handle, "_forward_end", model))
    handle.hooked_modules.append(weakref.ref(model))
    kwargs = {"always_call": True} if ALWAYS_CALL else {}
    for m in model.modules():
        if parameters_of(m) is None:
            continue
        m.register_forward_pre_hook(HandleHook(handle, "fast.begin", m))
        m.register_forward_hook(HandleHook(handle, "fast.end", m), **kwargs)
        if m is not model:
            handle.hooked_modules.append(weakref.ref(m))


def remove_hooks(handle: Any) -> None:
    """Removes every HandleHook of ``handle`` from the modules it hooked."""
    for ref in handle.hooked_modules:
        m = ref()
        if m is None:
            continue
        always = getattr(m, "_forward_hooks_always_called", None)
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            for k in [k for k, v in hooks.items()
                      if isinstance(v, HandleHook) and v.handle is handle]:
                del hooks[k]
                if always is not None:
                    always.pop(k, None)
    handle.hooked_modules.clear()
