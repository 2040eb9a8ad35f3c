"""The process's memory, as parameter offload needs it: glibc's mmap threshold fixed once
(so freed parameter buffers go back to the system) when memory is the limit
(:class:`ReleaseRule`, the ``release_memory`` argument of offload_parameters), and the
memory still available to this process (what pickling an offloaded model may take:
/proc/meminfo's MemAvailable, lowered by the headroom of every memory cgroup the process
is in), and the freed fetch buffers kept for the next fetch (:class:`ArrayPoolReservation`).

Thread-safety: :func:`fix_mmap_threshold` is process-wide and runs once (call it from one
thread); a ReleaseRule belongs to its offload's training thread; :func:`available_memory`
reads files only and is safe from any thread; the array pool is thread-safe.
"""

from __future__ import annotations

import os
import weakref
from typing import Optional

from ... import _strata


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: the mmap threshold of "keep": glibc's own ceiling of its dynamic threshold (64-bit)
KEEP_MMAP_THRESHOLD = 32 << 20
#: the trim threshold of "keep" at most: free memory at the heap's top kept for reuse
KEEP_TRIM_THRESHOLD = 1 << 30


def _mallopt(settings: "list[tuple[int, int]]") -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        for param, value in settings:
            libc.mallopt(ctypes.c_int(param), ctypes.c_int(value))
    except (OSError, AttributeError):  # not glibc
        pass


def fix_mmap_threshold() -> None:
    """Fixes glibc's mmap threshold at its default (128 KiB; process-wide, once; also the
    trim threshold at its default, 128 KiB). glibc raises the threshold to the size of
    each large block freed (up to 32 MiB), after which blocks of that size come from the
    heap and freeing them no longer returns memory: the parameter and gradient buffers
    that come and go then grow the resident set far past the working set (measured: 880 MB
    instead of 480 MB peak on the 138.7 M-parameter model of examples/train_offload.py).
    Overrides :func:`keep_freed_memory`. A no-op where glibc's mallopt is absent."""
    global _MMAP_FIXED
    if _MMAP_FIXED:
        return
    _MMAP_FIXED = True
    _mallopt([(_M_MMAP_THRESHOLD, 128 * 1024), (_M_TRIM_THRESHOLD, 128 * 1024)])


def keep_freed_memory(available: Optional[int]) -> None:
    """The opposite choice, where memory is not the limit (process-wide; not after
    :func:`fix_mmap_threshold`): the mmap threshold at 32 MiB (glibc's ceiling of its own
    dynamic threshold, reached at once instead of after the first frees) and the trim
    threshold at min(1 GiB, ``available`` / 8) bytes (``available`` None: 1 GiB), so the
    gradient- and parameter-sized buffers an offloaded iteration allocates and frees by
    the hundred are reused from the heap instead of being mapped and faulted in again
    page by page. glibc's dynamic defaults trim the heap's top whenever 32 MiB are free
    there: on the main job's model (working set 64 MiB) 112k minor faults and 4.1
    CPU-seconds per iteration, against 3.4k and 2.8 CPU-seconds kept (docs/offload.md,
    "Memory"). A no-op where glibc's mallopt is absent."""
    global _KEPT
    trim = KEEP_TRIM_THRESHOLD if available is None else min(KEEP_TRIM_THRESHOLD,
                                                                available // 8)
    trim = max(trim, 128 * 1024)
    if _MMAP_FIXED or trim <= _KEPT:  # (a later offload may only raise the trim threshold)
        return
    _KEPT = trim
    _mallopt([(_M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, trim)])


_MMAP_FIXED = False
_KEPT = 0  # the trim threshold keep_freed_memory set (0: not called)

#: a parameter's training state over its own bytes in the rule below: the parameter, its
#: gradient and two Adam moments, all of its dtype (fp32: 16 bytes per element)
STATE_FACTOR = 4


def mmap_threshold_fixed() -> bool:
    """Whether this process's mmap threshold was fixed (by parameter or activation
    offload: process-wide, for the rest of the process)."""
    return _MMAP_FIXED


def freed_memory_kept() -> bool:
    """Whether :func:`keep_freed_memory` set this process's thresholds (and no fix came
    after it)."""
    return bool(_KEPT) and not _MMAP_FIXED


class ReleaseRule:
    """How parameter offload sets glibc's malloc for the process: freed memory released
    (:func:`fix_mmap_threshold`) or kept for reuse (:func:`keep_freed_memory`).

    Releasing keeps the resident set near the working set (freed buffers go back to the
    system at once) but costs a page fault per 4 KiB page of every allocation of 128 KiB or
    more in the whole process -- torch's activations and gradients included, every
    iteration. Measured on the main job's model (138.7 M parameters, working set holding
    the model): 285k minor faults and 7.6 CPU-seconds per iteration fixed, 8 faults and 2.6
    CPU-seconds not (docs/offload.md, "Memory"). So it is worth it only where memory is the
    limit:

    - ``release_memory=True``: released at once; ``False``: kept (trim threshold 1 GiB);
    - ``None`` (default): kept from the start, released once :data:`STATE_FACTOR` x the
      bytes of the parameters offloaded so far exceed the memory available when the
      offload started (:func:`available_memory`: MemAvailable, or a memory cgroup's
      headroom where smaller; unknown counts as exceeded), i.e. when the training state
      would not fit in memory, which is what offloading it is for.

    Process-wide and one-way: once released (by any offload, or activation offload's
    ``release_memory=True``), released for the rest of the process.

    :param release_memory: True, False or None.
    :raises TypeError: another value (named ``release_memory``).
    """

    def __init__(self, release_memory: Optional[bool]):
        if release_memory is not None and not isinstance(release_memory, bool):
            raise TypeError("offload_parameters: release_memory must be True, False or None, "
                            f"got {release_memory!r} ({type(release_memory).__name__})")
        self.mode = release_memory
        self.offloaded_bytes = 0  # parameter bytes noted so far
        #: the memory available at the start (the rule's bound; None unless the rule decides)
        self.available = available_memory() if release_memory is None else None
        if release_memory is True:
            fix_mmap_threshold()
        elif release_memory is False or self.available is not None:
            keep_freed_memory(self.available)  # (False: None, the full trim threshold)

    def note(self, nbytes: int) -> None:
        """``nbytes`` more parameter bytes offloaded: releases when the rule says so (once;
        later calls only count)."""
        self.offloaded_bytes += nbytes
        if self.mode is None and not _MMAP_FIXED and (
                self.available is None
                or STATE_FACTOR * self.offloaded_bytes > self.available):
            fix_mmap_threshold()


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2: no limit) -> None


def _cgroup_headroom() -> Optional[int]:
    """Bytes the memory cgroups of this process (its own and every ancestor) still allow:
    the smallest ``limit - usage`` (cgroup v2 memory.max / memory.current, v1
    memory.limit_in_bytes / memory.usage_in_bytes); None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: Optional[int] = None
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":  # v2
            root, files = "/sys/fs/cgroup", ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1
            root, files = "/sys/fs/cgroup/memory", ("memory.limit_in_bytes",
                                                   "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for n in range(len(parts), -1, -1):
            d = os.path.join(root, *parts[:n])
            limit, usage = _read_int(os.path.join(d, files[0])), _read_int(os.path.join(d, files[1]))
            if limit is None or usage is None or limit >= 1 << 60:  # (v1: no limit)
                continue
            room = max(0, limit - usage)
            best = room if best is None else min(best, room)
    return best


def available_memory() -> Optional[int]:
    """Bytes of memory this process can still take without swapping or being killed:
    /proc/meminfo's MemAvailable, or less where a memory cgroup's limit leaves less room.
    None where neither can be read (not Linux)."""
    avail: Optional[int] = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    room = _cgroup_headroom()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail


class ArrayPoolReservation:
    """Raises the capacity of strata's array pool (the C++ binding's ArrayPool) by
    ``nbytes`` until :meth:`release` (or until this object is collected): a fetched
    parameter's buffer (Store.get), once its last reference is gone (evicted, no tensor or
    view left), is kept up to that many bytes for the next fetch of the same byte size,
    whose pages are then already mapped. On a host where a page fault costs 10-20 us a new
    100 MB buffer took longer to fault in than to read from the disk (Store.get 0.26-0.45
    GB/s into new memory against 2.4-2.9 GB/s into touched memory, 2026-12-06), and glibc
    maps every block above 32 MiB afresh whatever its thresholds. So an offload's memory
    is its working set plus at most ``nbytes`` (its budget) of freed buffers.

    :param nbytes: bytes (int >= 0).
    Thread-safety: release() is idempotent and may be called from any thread.
    """

    def __init__(self, nbytes: int):
        _strata._array_pool_reserve(int(nbytes))
        self._release = weakref.finalize(self, _strata._array_pool_reserve, -int(nbytes))

    def release(self) -> None:
        """Lowers the capacity again (the pool frees its oldest blocks down to it)."""
        self._release()
