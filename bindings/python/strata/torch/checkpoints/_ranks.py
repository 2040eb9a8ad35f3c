"""Files written by every rank at once, each rank its own byte ranges in place: the
machinery shared by the exports from ranks (checkpoints/_save_ranks.py: safetensors;
optim/_universal.py: DeepSpeed's universal layout). The protocol:

:func:`write_in_place` takes steps 2-4 for a writer given what it does in each;

1. :func:`agree`: every rank checks that all ranks were called with the same arguments and
   the same layout (an all-gather of 8-byte digests, one per named field), so every rank
   computes the one layout and no rank waits for a collective the others skip;
2. rank 0 creates each ``<file>.tmp`` at its final size and writes what is not tensor data
   (header, zip skeleton); :func:`outcome` then acts as the barrier that also carries
   rank 0's failure;
3. every rank writes its element range of each tensor (:func:`write_elements`: ``pwrite``
   of pieces read from its source; host memory one piece) and fsyncs;
4. :func:`outcome`: an all-gather of every rank's success, so either all ranks go on to
   the renames (rank 0) or all raise, rank 0 removing the ``.tmp`` files (nothing partial
   appears under a final name, an earlier file of that name is left as it was); then an
   all-gather of what each rank reports of its writes (bytes, CRC-32s), which rank 0 uses
   to seal the files (a zip's CRCs) before it renames them; a last :func:`outcome` carries
   rank 0's failure there to every rank.

Thread-safety: collective over the ranks of a communicator; plain functions otherwise.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._universal_zip import pwrite_all


def digest(value: Any) -> int:
    """An 8-byte digest of ``repr(value)`` as a signed int64 (equal values, equal digests;
    used only to compare what ranks were given)."""
    h = hashlib.blake2b(repr(value).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


def agree(comm: Any, who: str, fields: Dict[str, Any]) -> None:
    """Checks that every rank of ``comm`` holds the same value of each field (collective:
    one all-gather of ``len(fields)`` int64 digests). Every rank raises the same error, so
    none is left waiting.

    :raises ValueError: "<who>: rank R's <field> differs from rank 0's (every rank must
        call it with the same arguments and model)", naming the first differing field of
        the lowest differing rank."""
    names = list(fields)
    mine = np.array([digest(fields[n]) for n in names], dtype=np.int64)
    every = np.asarray(comm.all_gather(mine)).reshape(comm.size, len(names))
    for r in range(1, comm.size):
        for j, n in enumerate(names):
            if every[r, j] != every[0, j]:
                raise ValueError(f"{who}: rank {r}'s {n} differs from rank 0's (every rank "
                                 "must call it with the same arguments and model)")


def outcome(comm: Any, who: str, error: Optional[BaseException],
            cleanup: Callable[[], None] = lambda: None,
            what: str = "writing; nothing was renamed into place (the .tmp files are removed)"
            ) -> None:
    """After a step every rank took part in: an all-gather of each rank's success (a
    barrier that also carries failures). When any rank failed, every rank raises: the
    failed ranks their own ``error``, the others a RuntimeError naming the failed ranks;
    rank 0 first runs ``cleanup`` (removing the ``.tmp`` files). One process
    (``comm`` None): ``error`` is raised after ``cleanup``.

    :raises RuntimeError: "<who>: rank(s) [1] failed while <what>" (the default ``what``:
        "writing; nothing was renamed into place (the .tmp files are removed)")."""
    if comm is None:
        failed = [0] if error is not None else []
    else:
        flags = np.array([0 if error is None else 1], dtype=np.int64)
        every = np.asarray(comm.all_gather(flags)).reshape(-1)
        failed = [r for r in range(comm.size) if every[r]]
    if not failed:
        return
    rank = 0 if comm is None else comm.rank
    if rank == 0:
        try:
            cleanup()
        except OSError:
            pass  # the failure reported is the one that stopped the save
    if error is not None:
        raise error
    raise RuntimeError(f"{who}: rank(s) {failed} failed while {what}")


def write_in_place(comm: Any, who: str, paths: Sequence[str],
                   create_all: Callable[[List[str]], None],
                   write_mine: Callable[[List[str]], Sequence[int]],
                   seal: Callable[[List[str], np.ndarray], None] = lambda tmps, every: None,
                   finish: Callable[[], None] = lambda: None, durable: bool = True,
                   finishing: str = "finishing the files (renames) on rank 0") -> np.ndarray:
    """Steps 2-4 of the protocol for the files ``paths`` (each written as ``<path>.tmp``),
    after :func:`agree`: rank 0 runs ``create_all(tmps)``; every rank runs
    ``write_mine(tmps)`` (its writes, fsync'd when ``durable``), which returns int64
    values of the same count on every rank (e.g. its bytes and CRC-32s); once every rank
    succeeded, rank 0 runs ``seal(tmps, every)`` (``every[r]``: rank r's values), renames
    each ``.tmp`` over its path, fsyncs the directories (``durable``) and runs
    ``finish()``. ``comm`` None: one process, no collective. Returns this rank's values.

    :raises ValueError, RuntimeError, OSError: as :func:`outcome` (every rank raises: the
        failed rank its own error, the others RuntimeError "<who>: rank(s) [R] failed while
        creating the files / writing its slices / <finishing>"); the ``.tmp`` files are
        removed, nothing is renamed into place unless rank 0 failed in its renames or
        ``finish`` (what it did then stays)."""
    rank = 0 if comm is None else comm.rank
    tmps = [p + ".tmp" for p in paths]
    error: Optional[BaseException] = None
    if rank == 0:
        try:
            create_all(tmps)
        except Exception as e:  # noqa: BLE001 -- reported to every rank, then re-raised here
            error = e
    outcome(comm, who, error, lambda: remove_all(tmps),
            "creating the files; nothing was renamed into place (the .tmp files are removed)")
    mine = np.zeros(0, dtype=np.int64)
    try:
        mine = np.asarray(write_mine(tmps), dtype=np.int64).reshape(-1)
    except Exception as e:  # noqa: BLE001 -- the same
        error = e
    outcome(comm, who, error, lambda: remove_all(tmps),
            "writing its slices; nothing was renamed into place (the .tmp files are removed)")
    if comm is None:
        every = mine.reshape(1, -1)
    else:
        every = np.asarray(comm.all_gather(mine)).reshape(comm.size, len(mine))
    if rank == 0:
        try:
            seal(tmps, every)
            for tmp, path in zip(tmps, paths):
                os.replace(tmp, path)
            if durable:
                for d in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
                    fsync_dir(d)
            finish()
        except Exception as e:  # noqa: BLE001 -- the same
            error = e
    outcome(comm, who, error, lambda: remove_all(tmps), finishing)
    return mine


def create(path: str, nbytes: int, parts: Sequence[Tuple[bytes, int]]) -> None:
    """Creates (truncating) ``path`` of ``nbytes`` bytes, allocated ahead where the file
    system can (posix_fallocate, so a full drive fails here, on rank 0, and not mid-way on
    a rank), and writes each (bytes, file offset) of ``parts``. Not fsync'd.

    :raises OSError: naming ``path`` (errno)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        if nbytes:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno not in (95, 22):  # EOPNOTSUPP, EINVAL: a sparse file then
                    raise OSError(e.errno, f"cannot allocate {nbytes} bytes for {path!r}: "
                                  f"{e.strerror}") from None
        os.ftruncate(fd, nbytes)
        for data, at in parts:
            pwrite_all(fd, data, at)
    finally:
        os.close(fd)


def write_elements(fd: int, file_offset: int, itemsize: int, begin: int, end: int,
                   piece: int, read: Callable[[int, int], Any]) -> Tuple[int, int]:
    """Writes elements [begin, end) of one tensor into the open file ``fd`` in place: element
    i at ``file_offset + i * itemsize``, in pieces of at most ``piece`` elements, each
    ``read(i, n)`` (bytes-like of ``n * itemsize`` bytes: elements [i, i + n) in the file's
    dtype). Returns (bytes written, zlib CRC-32 of them).

    :raises OSError: a write fails; whatever ``read`` raises."""
    import zlib
    crc, written = 0, 0
    for at in range(begin, end, piece):
        n = min(piece, end - at)
        raw = memoryview(read(at, n)).cast("B")
        if len(raw) != n * itemsize:
            raise ValueError(f"a piece of {n} elements came as {len(raw)} bytes, expected "
                             f"{n * itemsize}")
        pwrite_all(fd, raw, file_offset + at * itemsize)
        crc = zlib.crc32(raw, crc)
        written += len(raw)
    return written, crc


def fsync_dir(directory: str) -> None:
    """fsync of a directory (its entries: renames and creations are durable).
    :raises OSError: naming nothing more than errno."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_all(paths: List[str]) -> None:
    """Removes the files that exist among ``paths`` (the ``.tmp`` files of a failed save)."""
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass
