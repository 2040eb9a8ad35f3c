"""The argument checks of offload_parameters / offload_init / ParameterOffload: each bad
argument is a TypeError (wrong type) or ValueError (bad value) that names the argument and
the value given.

Thread-safety: pure functions (they read the file system for ``path``).
"""

from __future__ import annotations

import numbers
import os
from typing import Any, List, Optional, Tuple

import torch

import strata

from .._common import UNIVERSAL_ROUTE
from ._parameter import record_of

_WHERE = "offload_parameters"


def _bad_type(name: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{_WHERE}: {name} must be {expected}, got {value!r} "
                     f"({type(value).__name__})")


def check_bool(name: str, value: Any) -> bool:
    """``value`` is a bool (True/False; not 0/1, not None).

    :raises TypeError: naming ``name`` and the value."""
    if not isinstance(value, bool):
        raise _bad_type(name, value, "a bool (True or False)")
    return value


def working_set_bytes(value: Any, name: str = "working_set") -> int:
    """The ``working_set`` argument (or the one called ``name``) as bytes (int > 0): an
    int, or a size string such as "64MiB" (strata.parse_size).

    :raises TypeError: None, a bool, a float or another type.
    :raises ValueError: <= 0, or a string that is not a size."""
    n = _byte_size(value, name)
    if n <= 0:
        raise ValueError(f"{_WHERE}: {name} must be > 0 bytes, got {value!r}")
    return n


def grad_host_budget_bytes(value: Any) -> int:
    """The ``grad_host_budget`` argument as bytes (int >= 0; 0: no gradient is kept in
    memory): an int, or a size string such as "256MiB" (strata.parse_size).

    :raises TypeError: None, a bool, a float or another type.
    :raises ValueError: < 0, or a string that is not a size."""
    n = _byte_size(value, "grad_host_budget")
    if n < 0:
        raise ValueError(f"{_WHERE}: grad_host_budget must be >= 0 bytes (0: every "
                         f"gradient goes to the store), got {value!r}")
    return n


def _byte_size(value: Any, name: str) -> int:
    """``value`` (int, or a size string) as an int, unchecked in sign."""
    if isinstance(value, str):
        try:
            n = strata.parse_size(value)
        except (ValueError, strata.Error) as e:
            raise ValueError(f"{_WHERE}: {name} {value!r} is not a byte size (e.g. "
                             f"'64MiB' or 67108864): {e}") from None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = int(value)
    else:
        raise _bad_type(name, value, "bytes as an int (e.g. 67108864) or a size "
                        "string (e.g. '64MiB')")
    return n


def check_tier(value: Any) -> str:
    """:raises TypeError: not a str. :raises ValueError: not "nvme" or "host"."""
    if not isinstance(value, str):
        raise _bad_type("tier", value, "'nvme' or 'host'")
    if value not in ("nvme", "host"):
        raise ValueError(f"{_WHERE}: tier must be 'nvme' or 'host', got {value!r}")
    return value


def check_key_prefix(value: Any) -> str:
    """A non-empty str without NUL characters (the C API and the CLI read keys as C
    strings; the store refuses an empty key).

    :raises TypeError: not a str. :raises ValueError: empty, or containing NUL."""
    if not isinstance(value, str):
        raise _bad_type("key_prefix", value, "a non-empty str such as 'params/'")
    if not value:
        raise ValueError(f"{_WHERE}: key_prefix must not be empty (store keys are "
                         "<key_prefix><parameter name>; e.g. 'params/')")
    if "\x00" in value:
        raise ValueError(f"{_WHERE}: key_prefix {value!r} contains a NUL character, which "
                         "store keys cannot hold")
    return value


def check_store_and_path(store: Any, path: Any) -> Optional[str]:
    """``store``: None or an open strata.Store; ``path``: None or a str / os.PathLike that
    is a directory or does not exist yet. Returns ``path`` as a str (or None).

    :raises TypeError: store not a strata.Store, path not a str or os.PathLike.
    :raises ValueError: a closed store; a path that is a file (not a directory); both
        store and path given."""
    if store is not None:
        if not isinstance(store, strata.Store):
            raise _bad_type("store", store, "a strata.Store (strata.Store.open(dir)) or None")
        if store.closed:
            raise ValueError(f"{_WHERE}: store {store!r} is closed")
        if path is not None:
            raise ValueError(f"{_WHERE}: pass store or path, not both (path={path!r})")
        return None
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise _bad_type("path", path, "a directory path (str or os.PathLike) or None")
    p = os.fspath(path)
    if not isinstance(p, str):
        raise _bad_type("path", path, "a str path (not bytes)")
    if os.path.exists(p) and not os.path.isdir(p):
        raise ValueError(f"{_WHERE}: path {p!r} is a file, not a directory (the store's "
                         "directory)")
    return p


def check_comm(value: Any) -> Any:
    """None or a strata.distributed.Communicator.

    :raises TypeError: another type."""
    if value is None:
        return None
    import strata.distributed as sd
    if not isinstance(value, sd.Communicator):
        raise _bad_type("comm", value, "a strata.distributed.Communicator or None")
    return value


def check_model(handle: Any, model: Any, resume: bool, overwrite: bool
                ) -> List[Tuple[str, torch.nn.Parameter]]:
    """The checks of ``ParameterOffload.attach(model, resume, overwrite)`` (errors as
    :func:`offload_parameters` documents them), before anything is stored.

    :returns: ``model.named_parameters()`` as a list.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"offload_parameters: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if resume and overwrite:
        raise ValueError("offload_parameters: resume=True keeps the stored parameters "
                         "that overwrite=True replaces: pass one of them")
    named = [(n, p) for n, p in model.named_parameters()]
    for n, p in named:
        if record_of(p) is not None and record_of(p).owner is not handle:
            raise ValueError(f"offload_parameters: parameter {n!r} is offloaded already")
        if not p.is_floating_point():
            raise ValueError(f"offload_parameters: parameter {n!r} has dtype {p.dtype}; "
                             "floating-point parameters only")
        if p.is_sparse:
            raise ValueError(f"offload_parameters: parameter {n!r} is sparse")
    existing = raw = set(handle.store.keys(handle.key_prefix))
    if handle.comm is not None:  # partitioned objects: named by their meta records
        existing = {k[:-len("#partmeta")] for k in raw if k.endswith("#partmeta")}
    for n, p in named:
        key = f"{handle.key_prefix}{n}"
        if resume and handle.comm is not None:
            if key not in existing:
                raise strata.NotFoundError(
                    f"offload_parameters(resume=True): rank {handle.comm.rank}'s store holds "
                    f"no part of parameter {n!r} (key {key!r})"
                    + (f"; it holds the whole parameter, written by one process: "
                       + UNIVERSAL_ROUTE if key in raw else
                       _other_size_hint(handle, existing, handle.comm.size)))
            _check_partition(handle, n, key)
        elif resume:
            if key not in existing:
                partitioned = f"{key}#partmeta" in handle.store.keys(key)
                raise strata.NotFoundError(
                    f"offload_parameters(resume=True): the store holds no parameter "
                    f"{n!r} (key {key!r})"
                    + (_other_size_hint(handle, {key}, 1) if partitioned else ""))
            info = handle.store.stat(key)
            if info.nbytes != p.numel() * p.element_size():
                raise ValueError(f"offload_parameters(resume=True): parameter {n!r} has "
                                 f"{p.numel() * p.element_size()} bytes ({p.dtype}), the "
                                 f"stored one {info.nbytes} ({info.dtype})")
        elif key in existing and not overwrite:
            raise strata.AlreadyExistsError(
                f"offload_parameters: the store already holds parameter {n!r} (key "
                f"{key!r}): pass resume=True to continue from the stored values, "
                "overwrite=True to replace them, or another key_prefix")
    return named


def _other_size_hint(handle: Any, keys: Any, size: int) -> str:
    """The end of a resume's "holds no part" error: the world size the store's partitioned
    parameters were written at, when one of ``keys`` records another one than ``size``
    ("" when none does: the store is simply not this model's)."""
    from strata.distributed import stat_partitioned
    for key in sorted(keys):
        try:
            info = stat_partitioned(handle.store, key)
        except strata.Error:
            continue
        if info.world_size != size:
            return (f"; this store holds rank {info.rank}'s part of parameters partitioned "
                    f"over {info.world_size} rank(s) ({info.key!r}), this run has "
                    f"{'one process' if size == 1 else f'{size} ranks'}: " + UNIVERSAL_ROUTE)
    return ""


def _check_partition(handle: Any, name: str, key: str) -> None:
    """resume under ZeRO-3: the part of ``key`` this rank's store holds must be this rank's
    slice at this world size.

    :raises ValueError: it was written at another world size, or by another rank (each
        named)."""
    from strata.distributed import stat_partitioned
    info = stat_partitioned(handle.store, key)
    comm = handle.comm
    if info.world_size == comm.size and info.rank != comm.rank:
        raise ValueError(
            f"offload_parameters(resume=True): rank {comm.rank} of {comm.size}'s store holds "
            f"rank {info.rank}'s part of parameter {name!r} (key {key!r}): each rank must "
            f"open the store it wrote (rank {info.rank}'s store path given to rank "
            f"{comm.rank}?)")
    if info.world_size != comm.size:
        raise ValueError(
            f"offload_parameters(resume=True): rank {comm.rank} of {comm.size}'s store holds "
            f"rank {info.rank} of {info.world_size}'s part of parameter {name!r} (key "
            f"{key!r}): " + UNIVERSAL_ROUTE)
