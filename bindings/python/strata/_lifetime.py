"""Closing order of strata's Python objects: what uses a store (an optimizer) is closed
before the store closes, and at interpreter exit.

An optimizer's close() is its last checkpoint (docs/offload.md, "Checkpoint and resume"),
and a checkpoint needs the store open. A :class:`strata.Store` therefore closes the objects
registered with :func:`register` first (the most recent first: a strata.torch optimizer
before the low-level optimizer it wraps), and an ``atexit`` handler closes every registered
object still alive when the interpreter exits (also after an uncaught KeyboardInterrupt,
whose traceback keeps the objects alive until then). Objects are held weakly: registering
keeps nothing alive, and garbage collection still closes them (their ``__del__``).
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any, Dict, List, Optional

#: id(store) -> weak references to the objects using it, in registration order
_users: Dict[int, List["weakref.ReferenceType[Any]"]] = {}


def register(store: Any, user: Any) -> None:
    """Closes ``user`` (its ``close()``) before ``store`` closes and at interpreter exit."""
    refs = _users.setdefault(id(store), [])
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(user))


def unregister(store: Any, user: Any) -> None:
    """Undoes :func:`register` (``user`` closed on its own)."""
    refs = _users.get(id(store))
    if refs is not None:
        refs[:] = [r for r in refs if r() is not None and r() is not user]


def close_users(store: Any) -> Optional[BaseException]:
    """Closes the live users of ``store``, the most recently registered first; every one is
    closed even when another's close() fails. Returns the first error (None: none)."""
    return _close_key(id(store))


def _close_key(key: int) -> Optional[BaseException]:
    first: Optional[BaseException] = None
    for ref in reversed(_users.pop(key, [])):
        user = ref()
        if user is None:
            continue
        try:
            user.close()
        except Exception as e:  # noqa: BLE001 (reported to the caller)
            if first is None:
                first = e
    return first


@atexit.register
def _close_all_at_exit() -> None:
    for key in list(_users):
        err = _close_key(key)
        if err is not None:
            print(f"strata: at interpreter exit, closing an optimizer failed: {err}",
                  file=sys.stderr)
