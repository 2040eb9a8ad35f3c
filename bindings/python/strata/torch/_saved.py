"""The seam between the saved-tensor hooks of the two strata.torch features that install
them: parameter offload (strata.torch.offload, whose hooks wrap each operation on an
offloaded parameter) and activation offload (strata.torch.activations, whose hooks wrap a
whole forward). torch applies only the innermost ``saved_tensors_hooks``, so parameter
offload's pack hook hands every tensor that is not a parameter to :func:`pack_outer` (the
activation offload active on this thread's stack, if any) and its unpack hook hands every
object that is not its own to :func:`unpack_any`.

Thread-safety: the stack is process-wide and changed by the thread that enters and leaves
an activation offload's ``with`` block (torch's forward thread); the functions only read it.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch

#: pack functions of the active activation offloads, innermost last
_STACK: List[Callable[[torch.Tensor], Any]] = []


class SavedHandle:
    """Base class of what an outer pack hook returns for a saved tensor: ``unpack()``
    gives the tensor back (see :func:`unpack_any`)."""

    __slots__ = ()

    def unpack(self) -> torch.Tensor:  # pragma: no cover (overridden)
        raise NotImplementedError


def push(pack: Callable[[torch.Tensor], Any]) -> None:
    """An activation offload's ``with`` block begins: ``pack`` packs the outer tensors."""
    _STACK.append(pack)


def pop(pack: Callable[[torch.Tensor], Any]) -> None:
    """Its block ends (``pack`` is removed wherever it is on the stack)."""
    for i in range(len(_STACK) - 1, -1, -1):
        if _STACK[i] is pack:
            del _STACK[i]
            return


def pack_outer(t: torch.Tensor) -> Any:
    """``t`` packed by the innermost active activation offload, or ``t`` itself."""
    return _STACK[-1](t) if _STACK else t


def unpack_any(x: Any) -> Any:
    """The tensor of a :class:`SavedHandle`, or ``x`` itself (a tensor kept as it is)."""
    return x.unpack() if isinstance(x, SavedHandle) else x
