"""The entry point of activation offload: :func:`offload_activations` and the
:class:`ActivationOffload` it returns (a context manager around forward, reusable for every
iteration so that its trace prefetches the next backward; ``stats``; ``close``).

Thread-safety: one ``with`` block at a time per object, entered and left on one thread
(torch's forward thread); ``stats`` may be called from any thread.
"""

from __future__ import annotations

import numbers
import os
import shutil
import weakref
from typing import Any, Dict, Optional, Union

import torch

import strata

from .. import _saved
from ..offload._memory import fix_mmap_threshold
from ._entry import Saved
from ._pool import Pool

_WHERE = "offload_activations"


def _size(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, str):
        try:
            n = strata.parse_size(value)
        except (ValueError, strata.Error) as e:
            raise ValueError(f"{_WHERE}: {name} {value!r} is not a byte size (e.g. '64MiB' "
                             f"or 67108864): {e}") from None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = int(value)
    else:
        raise TypeError(f"{_WHERE}: {name} must be bytes as an int or a size string such as "
                        f"'64MiB', got {value!r} ({type(value).__name__})")
    if n < minimum:
        raise ValueError(f"{_WHERE}: {name} must be >= {minimum} bytes, got {value!r}")
    return n


def _unpack(x: Any) -> Any:
    if type(x) is Saved:
        return x.owner.pool.unpack(x)
    pool = _CURRENT_UNPACKERS[-1] if _CURRENT_UNPACKERS else None
    if pool is not None:
        pool.begin_backward()
    return x


#: pools whose hooks are active (their kept tensors' unpacks mark backward)
_CURRENT_UNPACKERS: list = []


class ActivationOffload:
    """Saved activations of the forwards run inside ``with`` blocks of this object, in a
    host pool and the store's nvme tier (see :func:`offload_activations`)."""

    def __init__(self, store: Optional[strata.Store], path: Optional[str],
                 host_budget_bytes: Any, min_bytes: Any, prefetch: Any,
                 write_window_bytes: Any, key_prefix: str, release_memory: Any = True):
        self._closed = True
        if not isinstance(release_memory, bool):
            raise TypeError(f"{_WHERE}: release_memory must be a bool, got {release_memory!r}")
        budget = _size("host_budget_bytes", host_budget_bytes, 0)
        minimum = _size("min_bytes", min_bytes, 1)
        window = _size("write_window_bytes", write_window_bytes, 1)
        if isinstance(prefetch, bool):
            pwindow = (64 << 20) if prefetch else 0
        else:
            pwindow = _size("prefetch", prefetch, 0)
        if not isinstance(key_prefix, str):
            raise TypeError(f"{_WHERE}: key_prefix must be a non-empty str, got {key_prefix!r}")
        if not key_prefix:
            raise ValueError(f"{_WHERE}: key_prefix must be a non-empty str, got {key_prefix!r}")
        if store is not None and not isinstance(store, strata.Store):
            raise TypeError(f"{_WHERE}: store must be a strata.Store or None, got "
                            f"{type(store).__name__}")
        if store is not None and path is not None:
            raise ValueError(f"{_WHERE}: pass store or path, not both")
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{_WHERE}: path must be a str, an os.PathLike or None, got "
                            f"{type(path).__name__}")
        if path is not None:
            path = os.fspath(path)
        self._owned_dir: Optional[str] = None
        self._owns_store = store is None
        if store is None:
            if path is None:
                from strata._data_dir import make_temp_dir
                path = self._owned_dir = make_temp_dir("activations-")
            store = strata.Store.open(path, host_budget="8MiB", staging="32MiB",
                                      chunk_size="4MiB", durability="flush")
        for k in store.keys(key_prefix):  # left-overs of an earlier run (a path's store too)
            store.delete(k)
        self.store = store
        self.key_prefix = key_prefix
        self.host_budget_bytes, self.min_bytes = budget, minimum
        if release_memory:  # freed activation buffers go back to the system (process-wide)
            fix_mmap_threshold()
        self.pool = Pool(self, store, budget, minimum, window, pwindow, key_prefix)
        self._hooks: Any = None
        # one bound method for push and pop (_saved.pop matches by identity: a new
        # ``self.pool.pack`` each time never matched, and the stack grew per block)
        self._pack = self.pool.pack
        self._closed = False
        self._finalizer = weakref.finalize(self, _cleanup, self.pool, store if self._owns_store
                                           else None, self._owned_dir)

    def __enter__(self) -> "ActivationOffload":
        if self._closed:
            raise RuntimeError(f"{_WHERE}: the offload is closed")
        if self._hooks is not None:
            raise RuntimeError(f"{_WHERE}: this offload's with block is already active "
                               "(blocks of one offload do not nest)")
        self.pool.begin_segment()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pool.pack, _unpack)
        self._hooks.__enter__()
        _saved.push(self._pack)
        _CURRENT_UNPACKERS.append(self.pool)
        return self

    def __exit__(self, *exc: Any) -> None:
        hooks, self._hooks = self._hooks, None
        _saved.pop(self._pack)
        if _CURRENT_UNPACKERS and _CURRENT_UNPACKERS[-1] is self.pool:
            _CURRENT_UNPACKERS.pop()
        if hooks is not None:
            hooks.__exit__(*exc)
        self.pool.end_segment()

    def stats(self) -> Dict[str, Union[int, float]]:
        """The offload's counters since it was made or :meth:`reset_stats` (a new dict;
        bytes as ints, seconds as floats):

        * ``activation_bytes``: bytes of the saved tensors offloaded (each entry once: a
          view and its base, or a tensor saved twice, count once; a view of at least half
          of its storage counts the whole storage);
        * ``bytes_spilled`` / ``spills``: bytes and entries whose write to the store's nvme
          tier was issued; ``bytes_written``: those whose write completed (NVMe wear);
        * ``bytes_fetched``: bytes read back from the store;
        * ``pool_bytes``: bytes in the host pool now (writes in flight included);
          ``pool_peak_bytes``: its most;
        * ``prefetch_hits``: unpacks of spilled entries whose read had been issued ahead;
          ``prefetch_misses``: those read on demand (entries in the pool count as neither);
        * ``stall_seconds``: time unpacks waited for reads; ``fetch_seconds``: time the
          reads took (on the fetch thread, or on demand); ``write_wait_seconds``: time
          forwards waited for the write window;
        * ``tensors_packed`` (handles made), ``tensors_deduplicated`` (of them, ones that
          found their entry), ``tensors_kept`` (saved as they are: parameters, leaves,
          small ones), ``trace_mismatches`` (backwards that did not follow the trace: their
          forward packed other sizes, or they unpacked in an order it did not predict);
        * ``entries_alive``: entries a live graph still holds.

        Thread-safety: safe from any thread."""
        return self.pool.snapshot()

    def wait_spills(self) -> None:
        """Waits until every spill issued so far is written (their bytes then leave the
        host pool) and the store objects of the entries freed so far are deleted. Not needed for correctness (an entry still being written is read from
        memory); for measurements and tests that need a deterministic state.

        :raises strata.Error: a spill failed (e.g. DiskFullError)."""
        self.pool.wait_writes()

    def reset_stats(self) -> None:
        """Zeroes the counters (``pool_peak_bytes`` restarts at ``pool_bytes``)."""
        self.pool.reset()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Waits for writes in flight, deletes the store objects left, closes and removes a
        store this offload made. A graph saved in it cannot run backward afterwards
        (unpack raises RuntimeError). Idempotent.

        :raises RuntimeError: called inside this offload's with block."""
        if self._hooks is not None:
            raise RuntimeError(f"{_WHERE}: close() inside the offload's with block")
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __repr__(self) -> str:
        s = self.pool.stats
        return (f"<strata.torch.ActivationOffload host_budget={self.host_budget_bytes} "
                f"pool={s['pool_bytes']} spilled={s['bytes_spilled']}"
                f"{' closed' if self._closed else ''}>")


def _cleanup(pool: Pool, store: Optional[strata.Store], owned_dir: Optional[str]) -> None:
    pool.close()  # (a user's store closed first: nothing left to delete there)
    if store is not None and not store.closed:
        store.close()
    if owned_dir is not None:
        shutil.rmtree(owned_dir, ignore_errors=True)


def offload_activations(store: Optional[strata.Store] = None, *,
                        host_budget_bytes: Union[int, str] = "1GiB",
                        min_bytes: Union[int, str] = "1MiB", path: Optional[str] = None,
                        prefetch: Union[bool, int, str] = True,
                        write_window_bytes: Union[int, str] = "64MiB",
                        key_prefix: str = "activations/",
                        release_memory: bool = True) -> ActivationOffload:
    """Offloads what autograd saves for backward in the forwards run inside the returned
    object's ``with`` blocks (``torch.autograd.graph.saved_tensors_hooks``): saved tensors
    of at least ``min_bytes`` go to a host pool of ``host_budget_bytes`` and beyond it to
    the store's nvme tier, and come back, bit for bit, when backward needs them. The
    backward may run after the block; keep the object for every iteration (its trace of
    the last backward prefetches the next one) and close it at the end::

        act = strata.torch.offload_activations(host_budget_bytes="2GiB")
        for x, y in batches:
            with act:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
        act.close()

    Not offloaded (kept as autograd keeps them): parameters and views of parameters
    (strata's offloaded ones included), leaves that require grad, tensor subclasses,
    sparse/quantized/meta tensors, tensors smaller than ``min_bytes``, and what is saved
    during backward (a reentrant checkpoint's recomputation). Any dtype and shape; CPU and
    CUDA tensors (CUDA: copied to pinned memory on a side stream). See docs/activations.md.

    :param store: the strata.Store whose nvme tier takes the spilled activations (not
        closed by the offload; objects under ``key_prefix`` are deleted at the start as
        left-overs). Default: a store at ``path``, or a temporary one (removed at close).
    :param host_budget_bytes: bytes (int or "2GiB") of saved activations held in host
        memory; the oldest are spilled beyond it (0: every offloaded tensor is spilled).
    :param min_bytes: smaller saved tensors keep their own reference (>= 1; default 1 MiB).
    :param path: directory (str or os.PathLike) of the store made when ``store`` is
        None (objects under ``key_prefix`` there are deleted at the start as left-overs).
    :param prefetch: True (default: up to 64 MiB read ahead along the trace), False (on
        demand only), or the read-ahead window in bytes.
    :param write_window_bytes: bytes of spills in flight before a forward waits (>= 1).
    :param key_prefix: store keys are ``<key_prefix><n>``; the prefix is the offload's own.
    :param release_memory: fix glibc's mmap threshold at 128 KiB for the process (once,
        process-wide; as parameter offload does where memory is the limit,
        offload/_memory.py), so that freed buffers
        go back to the system and the resident set stays near the budget: without it the
        example's offloaded run was killed under its cgroup limit. Costs page faults on
        every large allocation of the process (measured: 2.4x the iteration time of the
        bench's model, in memory or offloaded); False where memory is not the limit.
    :returns: the :class:`ActivationOffload`.
    :raises TypeError: an argument of the wrong type (named).
    :raises ValueError: a size below its minimum or not a size, both store and path, an
        empty key_prefix (each naming the argument).
    :raises strata.Error: the store cannot be opened (see strata.Store.open).
    """
    return ActivationOffload(store, path, host_budget_bytes, min_bytes, prefetch,
                             write_window_bytes, key_prefix, release_memory)
