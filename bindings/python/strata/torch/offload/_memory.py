"""The process's memory, as parameter offload needs it: glibc's mmap threshold fixed once
(so freed parameter buffers go back to the system) and the memory still available to this
process (what pickling an offloaded model may take: /proc/meminfo's MemAvailable, lowered
by the headroom of every memory cgroup the process is in).

Thread-safety: :func:`fix_mmap_threshold` is process-wide and runs once (call it from one
thread); :func:`available_memory` reads files only and is safe from any thread.
"""

from __future__ import annotations

import os
from typing import Optional


def fix_mmap_threshold() -> None:
    """Fixes glibc's mmap threshold at its default (128 KiB; process-wide, once). glibc
    raises the threshold to the size of each large block freed (up to 32 MiB), after which
    blocks of that size come from the heap and freeing them no longer returns memory: the
    parameter and gradient buffers that come and go then grow the resident set far past
    the working set (measured: 880 MB instead of 480 MB peak on the 138.7 M-parameter
    model of examples/train_offload.py). A no-op where glibc's mallopt is absent."""
    global _MMAP_FIXED
    if _MMAP_FIXED:
        return
    _MMAP_FIXED = True
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        M_MMAP_THRESHOLD = -3
        libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(128 * 1024))
    except (OSError, AttributeError):
        pass


_MMAP_FIXED = False


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
